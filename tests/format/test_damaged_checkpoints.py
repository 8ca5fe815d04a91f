"""Property suite: tiny checkpoints of every architecture and producer format, damaged in every way
(tests/format/damage_corpus.py, plus hypothesis-chosen byte flips and truncations), each refused by
``volta-fp4 inspect`` with exit status 2 and one line naming the file (and the tensor where there is one), no
traceback; harmless changes (an absent input scale, a flipped FP4 weight byte) still validate."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit import damage
from tests.format import damage_corpus
from vllm_volta_fp4.cli import main
from vllm_volta_fp4.testing.tiny_model import ARCHS, FORMATS, make_tiny_checkpoint

CHECKPOINTS = [(arch, fmt) for arch in ARCHS for fmt in FORMATS]
# Deterministic and bounded, so CI time and results are the same on every run.
FLIPS = settings(max_examples=25, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    made = {}

    def get(arch: str, fmt: str) -> Path:
        if (arch, fmt) not in made:
            made[arch, fmt] = make_tiny_checkpoint(root / f"{arch}-{fmt}", arch, fmt)
        return made[arch, fmt]

    return get


def inspect(model_dir: Path) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `volta-fp4 inspect` run in-process; an escaping exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["inspect", str(model_dir)])
    return status, out.getvalue(), err.getvalue()


def damaged_copy(source: Path, case: damage.Damage, root: Path) -> Path:
    target = Path(tempfile.mkdtemp(dir=root)) / source.name
    shutil.copytree(source, target)
    case.apply(target)
    return target


def check(model_dir: Path, case: damage.Damage, refused: bool) -> str | None:
    """None when inspect behaves as the case expects, else what went wrong."""
    status, _, err = inspect(model_dir)
    if not refused:
        return None if status == 0 else f"{case}: refused a harmless change: {err.strip()}"
    lines = err.strip().splitlines()
    if status != 2 or len(lines) != 1 or not lines[0].startswith("volta-fp4 inspect: "):
        return f"{case}: status {status}, stderr {err!r}"
    message = lines[0]
    if str(model_dir) not in message or (case.file is not None and case.file not in message):
        return f"{case}: the message names no file of the checkpoint ({case.file}): {message}"
    if case.tensor is not None and f"'{case.tensor}'" not in message:
        return f"{case}: the message does not name tensor {case.tensor}: {message}"
    return None


@pytest.mark.parametrize(("arch", "fmt"), CHECKPOINTS)
def test_every_pristine_checkpoint_validates(pristine, arch, fmt):
    status, out, err = inspect(pristine(arch, fmt))
    assert status == 0 and "valid" in out and not err


@pytest.mark.parametrize(("arch", "fmt"), CHECKPOINTS)
def test_every_tensor_missing_mistyped_or_misshapen_is_refused(pristine, tmp_path, arch, fmt):
    cases = damage_corpus.tensor_damages(pristine(arch, fmt), arch)
    failures = [problem for case, refused in cases
                if (problem := check(damaged_copy(pristine(arch, fmt), case, tmp_path), case, refused))]
    assert len(cases) > 40 and not failures, failures[:10]


@pytest.mark.parametrize(("arch", "fmt"), CHECKPOINTS)
def test_every_damaged_config_is_refused(pristine, tmp_path, arch, fmt):
    cases = damage_corpus.config_damages(pristine(arch, fmt), fmt, arch)
    failures = [problem for case in cases
                if (problem := check(damaged_copy(pristine(arch, fmt), case, tmp_path), case, True))]
    assert not failures, failures[:10]


def _header(raw: bytes) -> tuple[int, dict]:
    """A safetensors file's (offset of its data section, header)."""
    end = 8 + struct.unpack("<Q", raw[:8])[0]
    return end, json.loads(raw[8:end])


def _draw_shard(data, pristine) -> tuple[Path, str]:
    """A pristine checkpoint of CHECKPOINTS and one of its shard files, drawn."""
    arch, fmt = data.draw(st.sampled_from(CHECKPOINTS), label="checkpoint")
    source = pristine(arch, fmt)
    return source, data.draw(st.sampled_from(sorted(set(damage.tensor_names(source).values()))), label="shard")


@FLIPS
@given(data=st.data())
def test_a_flipped_header_byte_is_refused_unless_the_header_means_the_same(pristine, tmp_path, data):
    source, shard = _draw_shard(data, pristine)
    _, end, metadata = damage.header_span(source / shard)
    offset = data.draw(st.integers(0, end - 1).filter(lambda o: metadata is None or not metadata[0] <= o < metadata[1]),
                       label="offset")
    case = damage.flip_byte(shard, offset, data.draw(st.integers(1, 255), label="mask"))
    target = damaged_copy(source, case, tmp_path)
    try:
        headers = [_header((root / shard).read_bytes())[1] for root in (target, source)]
        unchanged = offset >= 8 and headers[0] == headers[1]
    except (ValueError, UnicodeDecodeError):
        unchanged = False
    assert check(target, case, refused=not unchanged) is None, check(target, case, refused=not unchanged)


def _data_offset(raw: bytes, name: str) -> int:
    """Where tensor ``name``'s bytes start in the safetensors file ``raw``."""
    end, header = _header(raw)
    return end + header[name]["data_offsets"][0]


@FLIPS
@given(data=st.data())
def test_a_flipped_scale_byte_is_refused_exactly_when_the_scale_becomes_unusable(pristine, tmp_path, data):
    """Block scales must be finite and not negative (-0 is harmless), global scales finite and positive; any byte of
    a packed FP4 weight is two valid FP4 values, so a flip there is not detectable and must not be called damage."""
    arch, fmt = data.draw(st.sampled_from(CHECKPOINTS), label="checkpoint")
    source = pristine(arch, fmt)
    headers = damage_corpus.stored(source)
    roles = {"block": "weight_scale", "global": "weight_scale_2" if fmt.startswith("modelopt") else
             "weight_global_scale", "packed": "weight" if fmt.startswith("modelopt") else "weight_packed"}
    role = data.draw(st.sampled_from(sorted(roles)), label="role")
    candidates = sorted(name for name, (_, dtype, _) in headers.items() if name.endswith("." + roles[role])
                        and (role != "packed" or dtype == torch.uint8) and (role != "block" or dtype != torch.float32))
    name = data.draw(st.sampled_from(candidates), label="tensor")
    shard, dtype, shape = headers[name]
    size = math.prod(shape) * (4 if dtype == torch.float32 else 1)
    byte = data.draw(st.integers(0, size - 1), label="byte")
    mask = data.draw(st.integers(1, 255), label="mask")
    case = damage.flip_byte(shard, _data_offset((source / shard).read_bytes(), name) + byte, mask)
    target = damaged_copy(source, case, tmp_path)
    raw = (target / shard).read_bytes()
    start = _data_offset(raw, name)
    if role == "block":
        value = raw[start + byte]
        unusable = (value & 0x7F) == 0x7F or (value & 0x80 and value != 0x80)
    elif role == "global":
        element = raw[start + byte // 4 * 4:start + byte // 4 * 4 + 4]
        number = struct.unpack("<f", element)[0]
        unusable = not math.isfinite(number) or number <= 0
    else:
        unusable = False
    case = damage.Damage(case.label, case.apply, name if unusable else None, shard)
    assert check(target, case, refused=unusable) is None, check(target, case, refused=unusable)


@FLIPS
@given(data=st.data())
def test_a_truncated_shard_is_refused(pristine, tmp_path, data):
    source, shard = _draw_shard(data, pristine)
    case = damage.truncate(shard, data.draw(st.integers(0, (source / shard).stat().st_size - 1), label="length"))
    target = damaged_copy(source, case, tmp_path)
    assert check(target, case, refused=True) is None, check(target, case, refused=True)
