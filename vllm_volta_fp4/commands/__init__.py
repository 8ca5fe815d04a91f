"""One module per ``volta-fp4`` subcommand (see ``vllm_volta_fp4.cli``)."""
