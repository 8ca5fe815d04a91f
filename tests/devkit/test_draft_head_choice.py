"""devkit.engine.use_draft_head: the benchmarks' --draft-heads names map onto VLLM_VOLTA_FP4_DRAFT_HEAD as the plugin
reads it."""

from __future__ import annotations

import pytest

from devkit.engine import DRAFT_HEADS, use_draft_head
from vllm_volta_fp4 import envs


@pytest.mark.parametrize(("head", "format_read"), [("fp8", "fp8"), ("nvfp4", "nvfp4"), ("fp16", None)])
def test_each_head_name_is_what_the_plugin_reads(monkeypatch, head, format_read):
    monkeypatch.setenv(envs.DRAFT_HEAD.name, "unset by this test's teardown")
    use_draft_head(head)
    assert envs.draft_head_format() == format_read


def test_an_unknown_head_is_refused():
    with pytest.raises(ValueError, match="bf16"):
        use_draft_head("bf16")
    assert set(DRAFT_HEADS) == {"fp8", "nvfp4", "fp16"}
