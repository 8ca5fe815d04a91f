"""``volta-fp4``: the command-line tools. Each subcommand is a module in ``vllm_volta_fp4.cli`` exposing
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys

from vllm_volta_fp4 import __version__
from vllm_volta_fp4.format.checkpoint import CheckpointError

COMMANDS = ("demo", "inspect", "convert", "doctor", "plan", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="volta-fp4", description="Serve NVFP4 checkpoints with vLLM on V100 GPUs.")
    parser.add_argument("--version", action="version", version=f"vllm-volta-fp4 {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"vllm_volta_fp4.cli.{name}")
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CheckpointError as error:
        print(f"volta-fp4 {args.command}: {error}", file=sys.stderr)
        return 2

