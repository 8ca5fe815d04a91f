"""devkit.engine.use_draft_format: the benchmarks' --draft-formats names map onto VLLM_VOLTA_FP4_DRAFT_WEIGHTS as the
plugin reads it."""

from __future__ import annotations

import pytest

from devkit.engine import DRAFT_FORMATS, use_draft_format
from vllm_volta_fp4 import envs


@pytest.mark.parametrize(("name", "format_read"), [("fp8", "fp8"), ("nvfp4", "nvfp4"), ("fp16", None)])
def test_each_format_name_is_what_the_plugin_reads(monkeypatch, name, format_read):
    monkeypatch.setenv(envs.DRAFT_WEIGHTS.name, "unset by this test's teardown")
    use_draft_format(name)
    assert envs.draft_weights_format() == format_read


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="bf16"):
        use_draft_format("bf16")
    assert set(DRAFT_FORMATS) == {"fp8", "nvfp4", "fp16"}
