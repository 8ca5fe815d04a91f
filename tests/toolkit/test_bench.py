"""volta-fp4 bench: the metrics from known timings, the reports, input errors, and (engine) a shrunken protocol
against a real vLLM OpenAI server on CPU producing the markdown table, the CSV and the PNG."""

from __future__ import annotations

import csv
import socket

import pytest

from tests.conftest import requires_vllm
from vllm_volta_fp4.cli import main
from vllm_volta_fp4.toolkit.benchmark import (
    COLUMNS,
    BatchRound,
    BenchError,
    Protocol,
    RequestTiming,
    ResultRow,
    csv_text,
    markdown_table,
    percentile,
    write_reports,
)


def test_percentile_matches_numpy():
    numpy = pytest.importorskip("numpy")
    values = [0.31, 0.12, 0.95, 0.4, 0.77, 0.5, 0.21]
    for fraction in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert percentile(values, fraction) == pytest.approx(numpy.percentile(values, fraction * 100))
    assert percentile([2.5], 0.99) == 2.5


def test_batch_metrics_from_known_timings():
    # Two requests of 8 prompt tokens each: first tokens at 0.2 s and 0.4 s, 11 tokens each, done at 1.2 and 1.4 s.
    timings = [RequestTiming(0.0, 0.2, 1.2, 11), RequestTiming(0.0, 0.4, 1.4, 11)]
    batch = BatchRound(timings, input_len=8)
    assert batch.prefill_tokens_per_s == pytest.approx(2 * 8 / 0.4)
    assert batch.decode_tokens_per_s == pytest.approx(2 * 10 / (1.4 - 0.2))
    metrics = ResultRow(4096, 2, [batch]).metrics()
    assert metrics["ttft_ms_mean"] == pytest.approx(300.0)
    assert metrics["latency_s_p50"] == pytest.approx(1.3)
    assert metrics["decode_tok_s_per_seq"] == pytest.approx(metrics["decode_tok_s"] / 2)


@pytest.mark.parametrize("arguments, message", [
    ({"output_len": 1}, "output-len"),
    ({"batches": ()}, "batches"),
    ({"repeats": 0}, "repeats"),
    ({"input_len": 4000, "max_model_lens": (4096,)}, "shorter than input"),
])
def test_protocol_rejects_bad_input(arguments, message):
    with pytest.raises(BenchError, match=message):
        Protocol(**arguments)


def test_defaults_are_the_seeds_protocol():
    protocol = Protocol()
    assert (protocol.input_len, protocol.output_len, protocol.batches, protocol.max_model_lens) == \
        (512, 256, (1, 4, 8), (4096, 8192))


def test_reports_from_known_rows(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [ResultRow(length, batch, [BatchRound([RequestTiming(0.0, 0.1 * batch, 1.0 + batch, 16)] * batch, 32)])
            for length in (4096, 8192) for batch in (1, 4)]
    protocol = Protocol(32, 16, (1, 4), (4096, 8192), 1)
    written = write_reports(rows, protocol, tmp_path, "synthetic")
    assert [path.name for path in written] == ["results.md", "results.csv", "results.png"]
    table = written[0].read_text()
    assert table == markdown_table(rows, protocol, "synthetic") and table.count("\n| ") == len(rows) + 1
    parsed = list(csv.DictReader(written[1].read_text().splitlines()))
    assert [int(row["batch"]) for row in parsed] == [1, 4, 1, 4] and tuple(parsed[0]) == COLUMNS
    assert written[1].read_text() == csv_text(rows)
    assert written[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_mode_rejects_several_max_model_lens(capsys):
    # a running server has one max-model-len: refused before any request is sent
    assert main(["bench", "--url", "http://127.0.0.1:9", "--max-model-lens", "4096,8192", "--no-plot"]) == 2
    assert "once per value" in capsys.readouterr().err


def test_unreachable_server_is_a_clear_error(capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--no-plot"]) == 2
    assert "is the server running" in capsys.readouterr().err


@pytest.mark.engine
@requires_vllm
def test_bench_against_the_cpu_server_writes_all_three_outputs(openai_server, tmp_path, capfd):
    pytest.importorskip("matplotlib")
    out = tmp_path / "results"
    code = main(["bench", "--url", openai_server.url, "--input-len", "32", "--output-len", "16", "--batches", "1,4",
                 "--repeats", "2", "--out", str(out)])
    captured = capfd.readouterr()
    assert code == 0, captured.err
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert [(int(row["batch"]), int(row["requests"])) for row in rows] == [(1, 2), (4, 8)]
    for row in rows:
        assert int(row["max_model_len"]) == openai_server.max_model_len  # read from the server
        for column in COLUMNS[3:]:
            assert float(row[column]) > 0, column
        assert float(row["latency_s_p50"]) <= float(row["latency_s_p90"]) <= float(row["latency_s_p99"])
        assert float(row["ttft_ms_p50"]) / 1000 < float(row["latency_s_p50"])
    table = (out / "results.md").read_text()
    assert table in captured.out and f"| {openai_server.max_model_len} | 4 | 8 |" in table
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench: 4/4" in captured.err  # progress: 2 batch sizes × 2 rounds


def test_offline_speculative_config_reaches_the_engine(monkeypatch, tmp_path, capsys):
    from vllm_volta_fp4.toolkit import benchmark

    seen = {}

    def fake_bench_offline(model, protocol, engine_args):
        seen.update(engine_args)
        raise benchmark.BenchError("stopped after the engine arguments")

    monkeypatch.setattr("vllm_volta_fp4.cli.bench.bench_offline", fake_bench_offline)
    spec = '{"method": "mtp", "num_speculative_tokens": 3}'
    assert main(["bench", "--offline", str(tmp_path), "--speculative-config", spec, "--no-plot"]) == 2
    assert seen["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    with pytest.raises(SystemExit, match="num_speculative_tokens"):
        main(["bench", "--offline", str(tmp_path), "--speculative-config", '{"method": "mtp"}', "--no-plot"])


def test_a_server_that_wants_an_api_key_says_so(capsys):
    """HTTP 401 from the server: the error suggests --api-key (a loopback stand-in that refuses every request)."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (the handler's name is http.server's)
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "Unauthorized"}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code = main(["bench", "--url", f"http://127.0.0.1:{server.server_port}", "--no-plot", "--batches", "1"])
    finally:
        server.shutdown()
    error = capsys.readouterr().err
    assert code == 2 and "HTTP 401" in error and "--api-key" in error
