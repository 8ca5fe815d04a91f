"""volta-fp4 convert SRC DST: NVFP4 checkpoint → dense fp16 (or bf16/fp32) Hugging Face checkpoint."""

from __future__ import annotations

import torch

from vllm_volta_fp4.toolkit.convert import convert_to_dense

HELP = "dequantize an NVFP4 checkpoint (either producer, mixed FP8 too) into a dense Hugging Face checkpoint"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def add_arguments(parser) -> None:
    parser.add_argument("src", help="NVFP4 model directory")
    parser.add_argument("dst", help="output directory")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float16")
    parser.add_argument("--shard-size-gb", type=float, default=4.0, help="largest output shard (GB)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DST")
    parser.add_argument("--no-verify", action="store_true", help="skip re-reading the output to check it")
    parser.add_argument("--device", default="cpu", help="where to dequantize, e.g. cuda (much faster for big models)")


def run(args) -> int:
    dst = convert_to_dense(args.src, args.dst, dtype=_DTYPES[args.dtype], shard_bytes=int(args.shard_size_gb * 1e9),
                           force=args.force, verify=not args.no_verify, device=args.device)
    print(f"wrote {dst}")
    return 0
