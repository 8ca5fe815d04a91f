"""The seeds' benchmark protocol: fixed 512-token prompts, 256 generated tokens (EOS ignored), batches of 1, 4 and 8
concurrent requests, max-model-len 4096 and 8192; TTFT, prefill and decode throughput, request latency percentiles.

Two targets:
  * a running OpenAI-compatible server (vLLM's): one streaming ``/v1/completions`` request per sequence, all of a
    batch sent at once; TTFT is the arrival of the first streamed token. Prompts are token ids (made with the
    server's ``/tokenize``), so every request has exactly ``input_len`` prompt tokens. A server has one
    max-model-len: start it once per value (examples/benchmark.sh).
  * offline, ``vllm.LLM`` in this process, one engine per max-model-len. ``LLM.generate`` does not stream, so TTFT
    is the time of the same batch generating a single token, and all requests of a batch end together.

Results: ``results.md`` (markdown table), ``results.csv`` and ``results.png`` (matplotlib, the ``[bench]`` extra).
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_volta_fp4.toolkit.convert import Progress

# Any fixed ordinary English text: only its token ids are used, repeated up to the input length.
PROMPT_TEXT = ("The V100 keeps serving large language models long after newer GPUs arrived, because its memory is "
               "fast and plentiful and four-bit weights make a large model fit in it. ")
REQUEST_TIMEOUT_S = 600


class BenchError(RuntimeError):
    """A benchmark that cannot run, with what to do about it."""


@dataclass(frozen=True)
class Protocol:
    input_len: int = 512
    output_len: int = 256
    batches: tuple[int, ...] = (1, 4, 8)
    max_model_lens: tuple[int, ...] = (4096, 8192)
    repeats: int = 3

    def __post_init__(self):
        if self.input_len < 1 or self.output_len < 2:
            raise BenchError("--input-len must be at least 1 and --output-len at least 2 (decode speed needs two "
                             "tokens)")
        if not self.batches or min(self.batches) < 1 or self.repeats < 1:
            raise BenchError("--batches must list positive batch sizes and --repeats must be at least 1")
        too_short = [length for length in self.max_model_lens if length < self.input_len + self.output_len]
        if too_short:
            raise BenchError(f"max-model-len {too_short[0]} is shorter than input + output "
                             f"({self.input_len + self.output_len} tokens)")


@dataclass(frozen=True)
class RequestTiming:
    """One request, in seconds of time.monotonic()."""

    start: float
    first_token: float
    end: float
    completion_tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class BatchRound:
    """All requests of one batch, sent together."""

    timings: list[RequestTiming]
    input_len: int

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens of the whole batch over the time until the last first token."""
        start = min(t.start for t in self.timings)
        return self.input_len * len(self.timings) / (max(t.first_token for t in self.timings) - start)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after each first token, over the decode phase of the batch: aggregate decode throughput."""
        decoded = sum(t.completion_tokens - 1 for t in self.timings)
        return decoded / (max(t.end for t in self.timings) - min(t.first_token for t in self.timings))


def percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True)
class ResultRow:
    max_model_len: int
    batch: int
    rounds: list[BatchRound]

    def metrics(self) -> dict[str, float | int]:
        timings = [t for r in self.rounds for t in r.timings]
        latencies = [t.latency for t in timings]
        return {
            "max_model_len": self.max_model_len, "batch": self.batch, "requests": len(timings),
            "ttft_ms_mean": 1000 * _mean([t.ttft for t in timings]),
            "ttft_ms_p50": 1000 * percentile([t.ttft for t in timings], 0.5),
            "prefill_tok_s": _mean([r.prefill_tokens_per_s for r in self.rounds]),
            "decode_tok_s": _mean([r.decode_tokens_per_s for r in self.rounds]),
            "decode_tok_s_per_seq": _mean([r.decode_tokens_per_s for r in self.rounds]) / self.batch,
            "latency_s_p50": percentile(latencies, 0.5), "latency_s_p90": percentile(latencies, 0.9),
            "latency_s_p99": percentile(latencies, 0.99),
        }


COLUMNS = ("max_model_len", "batch", "requests", "ttft_ms_mean", "ttft_ms_p50", "prefill_tok_s", "decode_tok_s",
           "decode_tok_s_per_seq", "latency_s_p50", "latency_s_p90", "latency_s_p99")
HEADINGS = ("max-model-len", "batch", "requests", "TTFT mean (ms)", "TTFT p50 (ms)", "prefill tok/s",
            "decode tok/s", "decode tok/s/seq", "latency p50 (s)", "latency p90 (s)", "latency p99 (s)")


# ---------------------------------------------------------------- targets

class ServerTarget:
    """A running OpenAI-compatible vLLM server."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        models = self._get_json("/v1/models")["data"]
        if not models:
            raise BenchError(f"{self.base_url}/v1/models lists no model")
        chosen = next((m for m in models if m["id"] == model), None) if model else models[0]
        if chosen is None:
            raise BenchError(f"the server does not serve {model!r}; it serves {', '.join(m['id'] for m in models)}")
        self.model = chosen["id"]
        self.max_model_len = chosen.get("max_model_len")

    def _request(self, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, headers=self.headers)
        try:
            return urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S)
        except urllib.error.HTTPError as error:
            hint = ("; the server wants an API key: pass the one it was started with as --api-key"
                    if error.code == 401 else "")
            raise BenchError(f"{self.base_url}{path}: HTTP {error.code} {error.read().decode(errors='replace')[:300]}"
                             + hint) from error
        except OSError as error:
            raise BenchError(f"{self.base_url}{path}: {error}; is the server running (and is --url right)?") from error

    def _get_json(self, path: str, body: dict | None = None) -> dict:
        with self._request(path, body) as response:
            return json.loads(response.read())

    def tokenize(self, text: str) -> list[int]:
        return self._get_json("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})["tokens"]

    def _stream_one(self, prompt_ids: list[int], output_len: int, start_gate: threading.Barrier) -> RequestTiming:
        body = {"model": self.model, "prompt": prompt_ids, "max_tokens": output_len, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        start_gate.wait(timeout=REQUEST_TIMEOUT_S)
        start = time.monotonic()
        first_token, completion_tokens = None, None
        with self._request("/v1/completions", body) as response:
            for event in _server_sent_events(response):
                if event.get("choices") and first_token is None:
                    first_token = time.monotonic()
                if event.get("usage"):
                    completion_tokens = event["usage"]["completion_tokens"]
        end = time.monotonic()
        if first_token is None or completion_tokens is None:
            raise BenchError("the server's stream had no tokens or no usage (vLLM sends both with include_usage)")
        return RequestTiming(start, first_token, end, completion_tokens)

    def run_batch(self, prompt_ids: list[int], output_len: int, batch: int) -> BatchRound:
        gate = threading.Barrier(batch)
        results: list[RequestTiming | BaseException | None] = [None] * batch

        def worker(slot: int) -> None:
            try:
                results[slot] = self._stream_one(prompt_ids, output_len, gate)
            except BaseException as error:  # re-raised in the caller's thread below
                gate.abort()
                results[slot] = error

        threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in range(batch)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=REQUEST_TIMEOUT_S)
        for result in results:
            if isinstance(result, BaseException):
                raise result
            if result is None:
                raise BenchError(f"a request did not finish within {REQUEST_TIMEOUT_S} s")
        return BatchRound(results, len(prompt_ids))


def _server_sent_events(response) -> Iterator[dict]:
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data:") and line != "data: [DONE]":
            yield json.loads(line[len("data:"):])


class OfflineTarget:
    """``vllm.LLM`` in this process for one max-model-len."""

    def __init__(self, model: str, max_model_len: int, max_num_seqs: int, engine_args: dict):
        from vllm import LLM

        self.llm = LLM(model=model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, **engine_args)
        self.max_model_len = max_model_len

    def tokenize(self, text: str) -> list[int]:
        return self.llm.get_tokenizer().encode(text, add_special_tokens=False)

    def _generate(self, prompt_ids: list[int], tokens: int, batch: int) -> float:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        start = time.monotonic()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)] * batch, params, use_tqdm=False)
        if any(len(output.outputs[0].token_ids) != tokens for output in outputs):
            raise BenchError("the engine generated fewer tokens than asked although EOS is ignored")
        return time.monotonic() - start

    def run_batch(self, prompt_ids: list[int], output_len: int, batch: int) -> BatchRound:
        first_token = self._generate(prompt_ids, 1, batch)
        start = time.monotonic()
        total = self._generate(prompt_ids, output_len, batch)
        timing = RequestTiming(start, start + first_token, start + total, output_len)
        return BatchRound([timing] * batch, len(prompt_ids))

    def close(self) -> None:
        import gc

        del self.llm
        gc.collect()


def prompt_ids_of_length(tokenize: Callable[[str], list[int]], length: int) -> list[int]:
    """Exactly ``length`` token ids of ordinary text."""
    ids = tokenize(PROMPT_TEXT)
    if not ids:
        raise BenchError("the tokenizer turned the prompt text into no tokens")
    return (ids * (length // len(ids) + 1))[:length]


def run_protocol(target, protocol: Protocol, max_model_len: int, progress: Progress) -> list[ResultRow]:
    """Every batch size of the protocol against one target; one warm-up request first (Triton compiles the
    attention kernels on the first request of a V100 server: minutes that must not count)."""
    prompt_ids = prompt_ids_of_length(target.tokenize, protocol.input_len)
    target.run_batch(prompt_ids, protocol.output_len, 1)
    rows = []
    for batch in protocol.batches:
        rounds = []
        for _ in range(protocol.repeats):
            rounds.append(target.run_batch(prompt_ids, protocol.output_len, batch))
            progress.advance(f"max-model-len {max_model_len}, batch {batch}")
        rows.append(ResultRow(max_model_len, batch, rounds))
    return rows


def bench_server(url: str, protocol: Protocol, model: str | None = None, api_key: str | None = None
                 ) -> list[ResultRow]:
    target = ServerTarget(url, model, api_key)
    if target.max_model_len is not None and target.max_model_len < protocol.input_len + protocol.output_len:
        raise BenchError(f"the server's max-model-len {target.max_model_len} is shorter than input + output")
    progress = Progress(len(protocol.batches) * protocol.repeats, "bench")
    return run_protocol(target, protocol, target.max_model_len or 0, progress)


def bench_offline(model: str, protocol: Protocol, engine_args: dict,
                  after_protocol: Callable[[OfflineTarget, int], None] | None = None) -> list[ResultRow]:
    """The protocol on one offline engine per max-model-len; ``after_protocol(target, max_model_len)``, when
    given, runs on each engine before it closes (e.g. a profiler pass over the same engine)."""
    rounds = len(protocol.max_model_lens) * len(protocol.batches) * protocol.repeats
    progress = Progress(rounds, "bench")
    rows = []
    for max_model_len in protocol.max_model_lens:
        target = OfflineTarget(model, max_model_len, max(protocol.batches), engine_args)
        try:
            rows += run_protocol(target, protocol, max_model_len, progress)
            if after_protocol is not None:
                after_protocol(target, max_model_len)
        finally:
            target.close()
    return rows


# ---------------------------------------------------------------- reports

def _formatted(metrics: dict[str, float | int]) -> list[str]:
    return [f"{metrics[column]:.3f}" if column.startswith("latency") else
            f"{metrics[column]:.1f}" if isinstance(metrics[column], float) else str(metrics[column])
            for column in COLUMNS]


def markdown_table(rows: list[ResultRow], protocol: Protocol, target: str) -> str:
    lines = [f"Benchmark: {target}; input {protocol.input_len} tokens, output {protocol.output_len} tokens (EOS "
             f"ignored), {protocol.repeats} round(s) per batch size", "",
             "| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
    lines += ["| " + " | ".join(_formatted(row.metrics())) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[ResultRow]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.metrics())
    return out.getvalue()


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError('the PNG plot needs matplotlib: pip install "vllm-volta-fp4[bench]" (or pass --no-plot)'
                         ) from None


def write_plot(rows: list[ResultRow], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 3, figsize=(14, 4))
    panels = (("decode_tok_s", "decode tok/s (all sequences)"), ("ttft_ms_mean", "TTFT mean (ms)"),
              ("latency_s_p50", "request latency p50 (s)"))
    for axis, (column, label) in zip(axes, panels, strict=True):
        for max_model_len in sorted({row.max_model_len for row in rows}):
            series = [row.metrics() for row in rows if row.max_model_len == max_model_len]
            axis.plot([m["batch"] for m in series], [m[column] for m in series], marker="o",
                      label=f"max-model-len {max_model_len}")
        axis.set_xticks(sorted({row.batch for row in rows}))
        axis.set_xlabel("batch (concurrent requests)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def write_reports(rows: list[ResultRow], protocol: Protocol, out_dir: str | Path, target: str, plot: bool = True
                  ) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.md", out_dir / "results.csv"]
    written[0].write_text(markdown_table(rows, protocol, target))
    written[1].write_text(csv_text(rows))
    if plot:
        written.append(out_dir / "results.png")
        write_plot(rows, written[2], f"{target}: {protocol.input_len} in / {protocol.output_len} out")
    return written
