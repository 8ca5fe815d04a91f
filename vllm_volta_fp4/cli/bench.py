"""volta-fp4 bench: the seeds' benchmark protocol against a running server (--url) or offline (--offline MODEL)."""

from __future__ import annotations

import json
import sys

from vllm_volta_fp4.toolkit.benchmark import (
    BenchError,
    Protocol,
    bench_offline,
    bench_server,
    markdown_table,
    require_matplotlib,
    write_reports,
)

HELP = "TTFT, prefill/decode tok/s and latency percentiles (512 in / 256 out, batch 1/4/8) → markdown, CSV, PNG"
_DEFAULTS = Protocol()


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SystemExit(f"volta-fp4 bench: {text!r} is not a comma-separated list of integers") from None


def _speculative_config(text: str) -> dict:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"volta-fp4 bench: --speculative-config is not JSON ({error})") from None
    if not isinstance(config, dict) or "num_speculative_tokens" not in config:
        raise SystemExit("volta-fp4 bench: --speculative-config must be a JSON object with num_speculative_tokens, "
                         'e.g. \'{"method": "mtp", "num_speculative_tokens": 3}\'')
    return config


def add_arguments(parser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of a running OpenAI-compatible vLLM server, e.g. http://127.0.0.1:8000")
    target.add_argument("--offline", metavar="MODEL", help="run vllm.LLM in this process on this model directory")
    parser.add_argument("--model", help="served model name (--url; default: the server's first model)")
    parser.add_argument("--api-key", help="the server's --api-key")
    parser.add_argument("--input-len", type=int, default=_DEFAULTS.input_len, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=_DEFAULTS.output_len, help="generated tokens per request")
    parser.add_argument("--batches", type=_int_list, default=_DEFAULTS.batches, help="concurrent requests, e.g. 1,4,8")
    parser.add_argument("--max-model-lens", type=_int_list, help="offline engines to start, e.g. 4096,8192 "
                        "(default: 4096,8192; with --url the server's own)")
    parser.add_argument("--repeats", type=int, default=_DEFAULTS.repeats, help="rounds per batch size")
    parser.add_argument("--out", default="bench-results", help="directory for results.md, results.csv, results.png")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    offline = parser.add_argument_group("offline engine (--offline)")
    offline.add_argument("--quantization", default="volta_nvfp4")
    offline.add_argument("--dtype", default="half", help="half on a V100; float32 or bfloat16 on CPU")
    offline.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    offline.add_argument("--enforce-eager", action="store_true")
    offline.add_argument("--speculative-config", type=_speculative_config, metavar="JSON",
                         help='vLLM speculative decoding, e.g. \'{"method": "mtp", "num_speculative_tokens": 3}\' '
                         "for a Qwen3.5 checkpoint's MTP head")


def run(args) -> int:
    try:
        if args.url and args.max_model_lens:
            raise BenchError("a running server has one max-model-len; start it once per value "
                             "(examples/benchmark.sh does) instead of passing --max-model-lens with --url")
        protocol = Protocol(args.input_len, args.output_len, args.batches,
                            args.max_model_lens or (() if args.url else _DEFAULTS.max_model_lens), args.repeats)
        if not args.no_plot:
            require_matplotlib()  # before minutes of benchmarking, not after
        if args.url:
            rows, target = bench_server(args.url, protocol, args.model, args.api_key), f"server {args.url}"
        else:
            engine_args = {"quantization": args.quantization, "dtype": args.dtype,
                           "gpu_memory_utilization": args.gpu_memory_utilization, "enforce_eager": args.enforce_eager}
            target = f"offline {args.offline}"
            if args.speculative_config:
                engine_args["speculative_config"] = args.speculative_config
                target += f", speculative {json.dumps(args.speculative_config)}"
            rows = bench_offline(args.offline, protocol, engine_args)
    except BenchError as error:
        print(f"volta-fp4 bench: {error}", file=sys.stderr)
        return 2
    written = write_reports(rows, protocol, args.out, target, plot=not args.no_plot)
    print(markdown_table(rows, protocol, target))
    print("wrote " + ", ".join(str(path) for path in written))
    return 0
