"""devkit.host_time.host_profile: one generate's Python profile, with the functions the engine ran per step and
their call counts, lands in the file (the mtp_round_cost benchmark reads drafting-loop costs from it)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from devkit.host_time import host_profile  # noqa: E402


def draft_step_stand_in(tokens: int) -> int:
    return sum(range(tokens))


class FakeEngine:
    """What host_profile calls of vLLM's LLM: generate(prompts, params, use_tqdm)."""

    def __init__(self):
        self.requests = []

    def generate(self, prompts, params, use_tqdm=True):
        self.requests.append((prompts, params.max_tokens, params.temperature, use_tqdm))
        for _ in range(params.max_tokens):
            draft_step_stand_in(100)


def test_profile_names_the_engine_functions_with_their_call_counts(tmp_path):
    engine, path = FakeEngine(), tmp_path / "host-profile.log"
    host_profile(engine, [[5, 6, 7], [8]], decode_tokens=12, path=path)
    assert engine.requests == [([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8]}], 12, 0.0, False)]
    text = path.read_text()
    assert text.startswith("# one generate: 2 prompt(s), 12 tokens")
    rows = [line for line in text.splitlines() if "draft_step_stand_in" in line]
    assert len(rows) == 2, text  # once by cumulative time, once by own time
    assert all(row.split()[0] == "12" for row in rows), rows  # one call per decoded token
