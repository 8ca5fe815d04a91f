"""volta-fp4 inspect MODEL_DIR: recognise and validate a checkpoint, list how each layer is stored."""

from __future__ import annotations

from collections import Counter

from vllm_volta_fp4.format.checkpoint import Checkpoint

HELP = "recognise and validate an NVFP4 checkpoint and show how each layer is stored"


def add_arguments(parser) -> None:
    parser.add_argument("model_dir", help="Hugging Face model directory")
    parser.add_argument("--layers", action="store_true", help="list every layer, not only the totals")


def run(args) -> int:
    checkpoint = Checkpoint(args.model_dir)
    modules = checkpoint.validate()
    fmt = checkpoint.format
    print(f"{args.model_dir}: {fmt.producer} {fmt.algorithm} (config: {checkpoint.config_file.name}), "
          f"{len(checkpoint.tensors)} tensors, valid")
    for note in checkpoint.notes:
        print(f"note: {note}")
    counts = Counter(scheme.kind for scheme in modules.values())
    print("layers: " + ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items())))
    if args.layers:
        for module, scheme in modules.items():
            print(f"  {module}: {scheme.kind}{' (activation scales ignored)' if scheme.quantized_activations else ''}")
    return 0
