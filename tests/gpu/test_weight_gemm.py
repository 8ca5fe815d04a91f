"""The CUDA GEMMs against the float64 reference: both MMA atoms, all paths (fused, dequantize + cuBLAS, the
MMA GEMV for M <= 16, auto), NVFP4 and FP8 weights.

Every case draws fresh random data, poisons the output memory with NaN first (the op allocates its output from
the caching allocator, which hands back the freed poisoned block) and checks that every element was written,
that nothing is NaN, and ‖y − ref‖ / ‖ref‖ against a float64 reference. Runs only with CUDA and the built
extension (the device machine); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

from vllm_volta_fp4.format.nvfp4 import dequantize_fp8, dequantize_nvfp4, quantize_fp8, quantize_nvfp4
from vllm_volta_fp4.ops import linear

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not linear.is_available(), reason="needs CUDA and the built vllm_volta_fp4._C"),
]

# fp16 output rounding (2^-11 relative) dominates; fp32 accumulation is far below it.
REL_TOL = 2e-3
ELEMENT_TOL = 2e-3  # of the largest |output|: fp16 rounds each element to 2^-11 of itself
M_VALUES = [1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 33, 64, 255, 2048]
GEMV_MAX_M = 16  # kGemvMaxM in csrc/gemm/weight_gemm_shape.h: PATH_GEMV takes M <= 16
# (N, K): Qwen3.8-27B shapes (o_proj, down_proj) and odd multiples of 16 (not multiples of the 64 × 128 tile).
SHAPES = [(5120, 6144), (5120, 17408), (208, 400), (1040, 5136)]
ATOMS = [70, 80]


def _device_atoms() -> list[int]:
    return ATOMS if torch.cuda.get_device_capability()[0] >= 8 else [70]


def _mma_values(path: int) -> list[int | None]:
    """The fused kernel and the GEMV run once per MMA atom; the other paths have no atom to choose."""
    return _device_atoms() if path in (linear.PATH_FUSED, linear.PATH_GEMV) else [None]


def path_and_m(paths, m_values):
    """(path, M) parameters: every M for the fused and dequantize paths, M <= GEMV_MAX_M for the GEMV."""
    return [
        pytest.param(path, m, id=f"{name}-M{m}")
        for path, name in paths
        for m in m_values
        if path != linear.PATH_GEMV or m <= GEMV_MAX_M
    ]


def merged_nvfp4(n: int, k: int, device: torch.device, generator: torch.Generator):
    """A q/k/v-like merged weight: shards quantized separately, so each keeps its own global scale."""
    cuts = sorted({0, n, *(16 * int(c) for c in torch.randint(1, n // 16, (2,), generator=generator))})
    shards = []
    for begin, end in zip(cuts, cuts[1:], strict=False):
        magnitude = 10.0 ** float(torch.empty(1).uniform_(-3, 1, generator=generator))  # different scales per shard
        w = torch.randn(end - begin, k, generator=generator) * magnitude
        shards.append(quantize_nvfp4(w.to(device)))
    packed = torch.cat([s.packed for s in shards])
    block_scale = torch.cat([s.block_scale for s in shards])
    global_scale = torch.cat([s.global_scale.reshape(1).expand(s.packed.shape[0]) for s in shards])
    return packed, block_scale, global_scale


def poison_output_memory(m: int, n: int, device: torch.device) -> None:
    torch.empty(m * n, dtype=torch.float16, device=device).fill_(float("nan"))


def check_against_reference(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                            elementwise: bool = False) -> None:
    """Norm-relative error below REL_TOL; with ``elementwise`` (our kernels: exact decode, fp32 accumulation, one
    fp16 rounding) also every element within ELEMENT_TOL of the largest output, which a norm hides: a few wrong
    elements of a wide output barely move it."""
    ref = x.double() @ w.double().T
    if bias is not None:
        ref += bias.double()
    assert y.dtype == torch.float16 and y.shape == ref.shape
    assert torch.isfinite(y).all(), f"{(~torch.isfinite(y)).sum().item()} output elements unwritten or NaN"
    error = ((y.double() - ref).norm() / ref.norm()).item()
    assert error < REL_TOL, f"relative error {error:.2e}"
    if elementwise:
        off = (y.double() - ref).abs()
        limit = ELEMENT_TOL * ref.abs().max().item()
        worst = divmod(int(off.argmax()), ref.shape[1])
        assert off.max().item() <= limit, (f"{int((off > limit).sum())} of {off.numel()} elements off by more than "
                                           f"{limit:.2e}; worst [{worst[0]}, {worst[1]}]: {y[worst].item()} vs "
                                           f"{ref[worst].item()}")


@pytest.fixture(scope="module")
def device() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(scope="module")
def nvfp4_weights(device):
    """One merged weight per shape for the module (quantizing 17408-wide weights is the slow part)."""
    generator = torch.Generator().manual_seed(1234)
    return {shape: merged_nvfp4(*shape, device, generator) for shape in SHAPES}


def run_case(prepared_weight, op, m, n, k, w_ref, bias_on, mma, path, device):
    x = torch.randn(m, k, device=device).to(torch.float16)
    bias = torch.randn(n, device=device).to(torch.float16) if bias_on else None
    poison_output_memory(m, n, device)
    y = op(x, prepared_weight, bias, mma=mma, path=path)
    check_against_reference(y, x, w_ref, bias, elementwise=path in (linear.PATH_FUSED, linear.PATH_GEMV))
    assert not prepared_weight["split_k_counters"].any(), "split-K semaphores not left at zero"
    return x, bias, y


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}xK{s[1]}")
@pytest.mark.parametrize("path, m", path_and_m([(linear.PATH_FUSED, "fused"), (linear.PATH_GEMV, "gemv")], M_VALUES))
@pytest.mark.parametrize("bias_on", [False, True], ids=["nobias", "bias"])
def test_nvfp4_kernels(nvfp4_weights, shape, path, m, bias_on, device):
    """The fused kernel and the GEMV (both atoms): exact M handling, odd shapes, per-row scales, split-K / stream-K."""
    n, k = shape
    packed, block_scale, global_scale = nvfp4_weights[shape]
    prepared = linear.prepare_nvfp4(packed, block_scale, global_scale)
    w = dequantize_nvfp4(packed, block_scale, global_scale)
    for mma in _mma_values(path):
        x, bias, y = run_case(prepared, linear.nvfp4_linear, m, n, k, w, bias_on, mma, path, device)
        again = linear.nvfp4_linear(x, prepared, bias, mma=mma, path=path)
        assert torch.equal(y, again), f"path={path} mma={mma}: two runs on the same input differ (race?)"


@pytest.mark.parametrize("shape", [(1040, 128), (4160, 256)], ids=lambda s: f"N{s[0]}xK{s[1]}")
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_blocks_of_whole_strips(shape, m, device):
    """K of one or two tiles: each GEMV block covers whole strips (no pieces); (1040, 128) ends on a 1-tile block."""
    n, k = shape
    q = quantize_nvfp4(torch.randn(n, k, device=device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)
    w = dequantize_nvfp4(q.packed, q.block_scale, q.global_scale)
    for mma in _mma_values(linear.PATH_GEMV):
        run_case(prepared, linear.nvfp4_linear, m, n, k, w, True, mma, linear.PATH_GEMV, device)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}xK{s[1]}")
@pytest.mark.parametrize("m", [1, 5, 17, 255, 2048])
@pytest.mark.parametrize("path", [linear.PATH_DEQUANT_CUBLAS, linear.PATH_AUTO], ids=["dequant_cublas", "auto"])
def test_nvfp4_other_paths(nvfp4_weights, shape, m, path, device):
    n, k = shape
    packed, block_scale, global_scale = nvfp4_weights[shape]
    prepared = linear.prepare_nvfp4(packed, block_scale, global_scale)
    run_case(prepared, linear.nvfp4_linear, m, n, k, dequantize_nvfp4(packed, block_scale, global_scale), True,
             None, path, device)


@pytest.fixture
def one_mib_dequant_chunks():
    """Dequantize + cuBLAS in chunks of at most 1 MiB of fp16 (the default, 128 MiB, is one chunk for most tests)."""
    torch.ops.volta_fp4.configure_gemm(-1, -1, 1)
    yield
    linear.configure_from_environment()


@pytest.mark.parametrize("shape", [(1040, 5136), (4816, 2064)], ids=lambda s: f"N{s[0]}xK{s[1]}")
@pytest.mark.parametrize("m", [17, 300])
def test_dequant_cublas_in_small_chunks(one_mib_dequant_chunks, shape, m, device):
    """Many equal chunks of whole 64-row tiles (1040 × 5136: 17 of one tile, the last of 16 rows; 4816 × 2064: 26
    of three tiles, the last of 16 rows), each with its slice of the bias."""
    n, k = shape
    q = quantize_nvfp4(torch.randn(n, k, device=device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)
    run_case(prepared, linear.nvfp4_linear, m, n, k, dequantize_nvfp4(q.packed, q.block_scale, q.global_scale), True,
             None, linear.PATH_DEQUANT_CUBLAS, device)


@pytest.mark.parametrize("shape", [(5120, 6144), (208, 400), (1040, 5136)], ids=lambda s: f"N{s[0]}xK{s[1]}")
@pytest.mark.parametrize(
    "path, m",
    path_and_m(
        [(linear.PATH_FUSED, "fused"), (linear.PATH_DEQUANT_CUBLAS, "dequant_cublas"), (linear.PATH_GEMV, "gemv")],
        M_VALUES,
    ),
)
def test_fp8(shape, path, m, device):
    n, k = shape
    weight, scale = quantize_fp8(torch.randn(n, k, device=device) * 0.05, per_channel=True)
    prepared = linear.prepare_fp8(weight, scale)
    w = dequantize_fp8(weight, scale)
    for mma in _mma_values(path):
        run_case(prepared, linear.fp8_linear, m, n, k, w, m % 2 == 1, mma, path, device)


@pytest.mark.parametrize("path, m", path_and_m([(linear.PATH_FUSED, "fused"), (linear.PATH_GEMV, "gemv"),
                                                 (linear.PATH_DEQUANT_CUBLAS, "dequant_cublas")], [1, 3, 8, 64]))
def test_super_activation_meets_its_blocks_largest_weight(path, m, device):
    """fp16 safety (see devkit/fp16_safety.py): a bf16-trained model's super activation (2e4) in the
    down_proj input meets the super weight, its NVFP4 block's largest element (code ±6). Every path must keep the
    sums in fp32: an fp16 partial sum of 16 products would be 1.2e5 here (the first overflow of the old CUDA-core
    GEMV) although the output, 3e4, fits fp16."""
    n, k = 256, 1024
    generator = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=generator) * 0.02
    w[7, 123] = 1.5  # the super weight: its block's amax
    x = torch.randn(m, k, generator=generator) * 0.5
    x[0, 123] = 2.0e4  # the super activation (the first token)
    q = quantize_nvfp4(w.to(device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)
    w_ref = dequantize_nvfp4(q.packed, q.block_scale, q.global_scale)
    x = x.to(device).to(torch.float16)
    for mma in _mma_values(path):
        poison_output_memory(m, n, device)
        y = linear.nvfp4_linear(x, prepared, None, mma=mma, path=path)
        check_against_reference(y, x, w_ref, None)
        assert abs(y[0, 7].item()) > 2.0e4, "the super weight's output (≈ 3e4) is in the result"


def test_scalar_global_scale_and_strided_inputs(device):
    n, k = 1040, 400
    q = quantize_nvfp4(torch.randn(n, k, device=device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)  # scalar global scale
    w = dequantize_nvfp4(q.packed, q.block_scale, q.global_scale)
    wide = torch.randn(5, k + 16, device=device).to(torch.float16)[:, :k]  # row stride k + 16, loadable in place
    transposed = torch.randn(k, 7, device=device).to(torch.float16).t()  # column stride ≠ 1: copied first
    batched = torch.randn(2, 3, k, device=device).to(torch.float16)
    variants = [(mma, path) for mma in _device_atoms() for path in (linear.PATH_FUSED, linear.PATH_GEMV)]
    variants.append((None, linear.PATH_AUTO))
    for x in (wide, transposed, batched):
        for mma, path in variants:
            y = linear.nvfp4_linear(x, prepared, None, mma=mma, path=path)
            assert y.shape == (*x.shape[:-1], n)
            check_against_reference(y.reshape(-1, n), x.reshape(-1, k), w, None)


def test_empty_batch(device):
    q = quantize_nvfp4(torch.randn(64, 128, device=device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)
    assert linear.nvfp4_linear(torch.empty(0, 128, device=device, dtype=torch.float16), prepared).shape == (0, 64)


def test_input_validation(device):
    q = quantize_nvfp4(torch.randn(64, 128, device=device))
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)
    with pytest.raises(TypeError, match="float16"):
        linear.nvfp4_linear(torch.randn(2, 128, device=device), prepared)
    with pytest.raises(RuntimeError, match="do not match"):
        linear.nvfp4_linear(torch.randn(2, 256, device=device).half(), prepared)
    with pytest.raises(RuntimeError, match="bias"):
        linear.nvfp4_linear(torch.randn(2, 128, device=device).half(), prepared, torch.zeros(63, device=device).half())
    with pytest.raises(RuntimeError, match="GEMV"):
        linear.nvfp4_linear(torch.randn(GEMV_MAX_M + 1, 128, device=device).half(), prepared, path=linear.PATH_GEMV)
    with pytest.raises(RuntimeError, match="multiples of 16"):
        linear.prepare_nvfp4(q.packed[:, :60], q.block_scale[:, :7], q.global_scale)


def test_fake_implementations_trace(device):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = quantize_nvfp4(torch.randn(1040, 400, device=device))
    x = torch.randn(3, 5, 400, device=device).half()
    prepared = linear.prepare_nvfp4(q.packed, q.block_scale, q.global_scale)  # eager, at load time
    mode = FakeTensorMode()
    fake_prepared = {name: mode.from_tensor(tensor) for name, tensor in prepared.items()}
    fake_x = mode.from_tensor(x)
    with mode:
        y = linear.nvfp4_linear(fake_x, fake_prepared)
        assert y.shape == (3, 5, 1040) and y.dtype == torch.float16
