"""A real vLLM engine with the whole plugin on a CUDA GPU: tiny NVFP4 checkpoints (every producer format, mixed
FP8+NVFP4, Llama- and Qwen3-shaped, made here) served with ``quantization="volta_nvfp4"`` and the plugin's attention
backend in fp16, against the same checkpoint dequantized to fp16 and served unquantized by the same engine with
vLLM's own attention.

Every engine runs with prefix caching on and a batched-token budget of 32, so the 150-token prompt is prefilled in
chunks, and generates the prompts twice: the second pass starts from cached prefix blocks. Greedy tokens must be
identical, except where the reference itself was at a near-tie (top two log-probabilities within NEAR_TIE): fp16
GEMMs that round differently may then legitimately pick the other token, after which the texts differ.

Skipped without CUDA, vLLM or the built extension. On the GPU machine: scripts/gpu/run_e2e_gpu.sh (both vLLM versions).
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from devkit.engine import attention_impls, cuda_graph_modes
from vllm_volta_fp4.ops import linear
from vllm_volta_fp4.testing.greedy import (
    ENGINE_MODES,
    WITHOUT_VLLM_KERNELS,
    Generation,
    generate_with,
    supported_engine_args,
)
from vllm_volta_fp4.testing.tiny_model import FORMATS, make_tiny_checkpoint
from vllm_volta_fp4.toolkit.convert import convert_to_dense

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM"),
    pytest.mark.skipif(not linear.is_available(), reason="needs CUDA and the built extension"),
]

MAX_TOKENS = 24
NEAR_TIE = 0.05
VOLTA_IMPL = "VoltaAttentionImpl"
SHARED_PREFIX = [(7 * i + 11) % 370 + 5 for i in range(48)]  # three 16-token KV blocks shared by two prompts
PROMPTS = [SHARED_PREFIX + [17, 42, 99], SHARED_PREFIX + [23, 5], [(13 * i) % 370 + 5 for i in range(150)], [9]]
ENGINE = {
    **WITHOUT_VLLM_KERNELS,
    "dtype": "float16",
    "max_model_len": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 32,  # the 150-token prompt is prefilled in five pieces
    "enable_prefix_caching": True,
    "gpu_memory_utilization": 0.3,
    "kv_cache_memory_bytes": 256 * 2**20,  # a fixed small cache: no profiling-based sizing, fast start
    "seed": 0,
}
# vLLM's default mode as users run it (torch.compile, CUDA graphs), still without vLLM's compiled kernels: Inductor
# writes the norms, rotary and activations (custom_ops none). A few capture sizes keep the engine start short.
DEFAULT_MODE = {**ENGINE_MODES["default"],
                "compilation_config": {"custom_ops": ["none"], "cudagraph_capture_sizes": [1, 2, 4, 8]}}
MODES = {"eager": {}, "default-mode": DEFAULT_MODE}  # eager: ENGINE's own (runs of the same settings are shared)
# Where the graph modes vLLM chose are appended (JSON lines), for the closing note; unset: not recorded.
GRAPH_MODES_FILE = os.environ.get("VOLTA_FP4_GRAPH_MODES_FILE")
# In-process engine core, so the test can see which attention implementation the engine really runs; offline;
# tensor-parallel workers spawned (this process has initialised CUDA, which a forked worker cannot use).
ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
               "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
# The Qwen3.5 hybrid: text only (its tiny vision tower is loaded but never run), vLLM's Triton GDN linear. With
# prefix caching vLLM sizes attention blocks to the GDN state (80 tokens here) and needs a step budget of a block.
QWEN3_5 = {"language_model_only": True, "gdn_prefill_backend": "triton", "max_num_batched_tokens": 128}


@pytest.fixture(scope="module", autouse=True)
def engine_environment():
    saved = dict(os.environ)
    os.environ.update(ENVIRONMENT)
    import vllm_volta_fp4

    vllm_volta_fp4.register()  # in case the entry points are not installed in this environment
    yield
    os.environ.clear()
    os.environ.update(saved)


class Runs:
    """Engine runs shared by the tests of this module, each made once: (checkpoint, settings) → generations."""

    def __init__(self, root: Path):
        self.root = root
        self.cache: dict[tuple, tuple[set[str], list[Generation], list[Generation]]] = {}
        self.graph_modes: dict[tuple, dict] = {}

    def checkpoint(self, arch: str, fmt: str, head_dim: int | None = None) -> Path:
        path = self.root / f"{arch}-{fmt}-{head_dim or 'default'}"
        if not path.exists():
            make_tiny_checkpoint(path, arch, fmt, head_dim=head_dim)
        return path

    def dense(self, arch: str, fmt: str, head_dim: int | None = None) -> Path:
        path = self.root / f"{arch}-{fmt}-{head_dim or 'default'}-dense"
        if not path.exists():
            convert_to_dense(self.checkpoint(arch, fmt, head_dim), path, dtype=torch.float16)
        return path

    def run(self, model: Path, **settings) -> tuple[set[str], list[Generation], list[Generation]]:
        """(attention impls, first pass, second pass from cached prefixes). Unquantized models that hold the same
        weights (the dense form of the NVFP4 formats) share one run."""
        key = self.key(model, settings)
        if key not in self.cache:
            llm = start_engine({**ENGINE, "model": str(model), **settings})
            try:
                first = generate_with(llm, PROMPTS, MAX_TOKENS)
                second = generate_with(llm, PROMPTS, MAX_TOKENS)
                self.cache[key] = (attention_impls(llm), first, second)
                self.graph_modes[key] = cuda_graph_modes(llm)
            finally:
                del llm
                gc.collect()
                torch.cuda.empty_cache()
        return self.cache[key]

    def key(self, model: Path, settings: dict) -> tuple:
        return _weights_digest(model), json.dumps(settings, sort_keys=True)

    def graph_modes_of(self, model: Path, **settings) -> dict:
        """The CUDA graph modes of a finished run (see devkit.engine.cuda_graph_modes)."""
        return self.graph_modes[self.key(model, settings)]


def assert_full_decode_graphs(modes: dict, mode: str, what: str) -> None:
    """In default mode vLLM keeps FULL graphs for uniform decode batches (our attention and GDN support them) and
    has captured some; eager runs capture none. Appends what it saw to GRAPH_MODES_FILE."""
    if GRAPH_MODES_FILE:
        import vllm

        with open(GRAPH_MODES_FILE, "a") as handle:
            handle.write(json.dumps({"vllm": vllm.__version__, "run": what, "mode": mode, **modes}) + "\n")
    assert modes, f"{what}: the model runner cannot be reached"
    if mode == "eager":
        assert modes["full"] == modes["piecewise"] == 0, f"{what}: {modes}"
    else:
        assert modes["mode"] in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL") and modes["full"] > 0, \
            f"{what}: vLLM did not capture FULL decode graphs: {modes}"


def start_engine(settings: dict):
    """vllm.LLM(**settings). An engine that fails to start is reported as text only: its traceback would keep the
    half-built engine (GPU memory, global state) alive for the tests that follow."""
    from vllm import LLM

    failure = None
    try:
        return LLM(**supported_engine_args(settings))
    except Exception as error:  # noqa: BLE001  (re-raised below, without the frames)
        failure = "".join(traceback.format_exception(error))[-6000:]
    gc.collect()
    torch.cuda.empty_cache()
    raise RuntimeError(f"the engine did not start:\n{failure}")


def _weights_digest(model: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(model.glob("*.safetensors")) + [model / "config.json"]:
        digest.update(file.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("e2e"))


def assert_same_greedy(ours: list[Generation], reference: list[Generation], what: str) -> None:
    """Identical tokens, or a first divergence where the reference's top two were within NEAR_TIE."""
    for index, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        step = mine.first_divergence(theirs)
        if step is None:
            continue
        assert theirs.margin(step) < NEAR_TIE, (
            f"{what}: prompt {index} diverges at token {step} of {MAX_TOKENS} where the reference was "
            f"{theirs.margin(step):.3f} ahead of its runner-up (ours {mine.token_ids}, reference {theirs.token_ids})")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_plugin_serves_like_the_dequantized_model(runs, arch, fmt, mode):
    """In eager and in default mode against the dequantized model (eager, vLLM's Triton attention)."""
    model, settings = runs.checkpoint(arch, fmt), {"quantization": "volta_nvfp4", "attention_backend": "CUSTOM",
                                                   **MODES[mode]}
    impls, first, second = runs.run(model, **settings)
    _, reference, _ = runs.run(runs.dense(arch, fmt), attention_backend="TRITON_ATTN")
    assert impls == {VOLTA_IMPL}
    assert_full_decode_graphs(runs.graph_modes_of(model, **settings), mode, f"{arch} {fmt}")
    assert_same_greedy(first, reference, f"{arch} {fmt} {mode} volta_nvfp4 vs dequantized fp16")
    assert_same_greedy(second, first, f"{arch} {fmt} {mode} prefix-cache hits vs first pass")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", ["ct-w4a16", "modelopt-mixed"])
def test_qwen3_5_hybrid_serves_like_the_dequantized_model(runs, fmt, mode, triton_allocator):
    """Qwen3.5 (Gated-DeltaNet + gated attention, vision tower; the exclusions real exports make) through
    volta_nvfp4: our GEMMs and attention, vLLM's GDN linear."""
    model = runs.checkpoint("qwen3_5", fmt)
    settings = {"quantization": "volta_nvfp4", "attention_backend": "CUSTOM", **QWEN3_5, **MODES[mode]}
    impls, first, second = runs.run(model, **settings)
    _, reference, _ = runs.run(runs.dense("qwen3_5", fmt), attention_backend="TRITON_ATTN", **QWEN3_5)
    assert VOLTA_IMPL in impls
    assert_full_decode_graphs(runs.graph_modes_of(model, **settings), mode, f"qwen3_5 {fmt} vLLM GDN")
    assert_same_greedy(first, reference, f"qwen3_5 {fmt} {mode} volta_nvfp4 vs dequantized fp16")
    assert_same_greedy(second, first, f"qwen3_5 {fmt} {mode} prefix-cache hits vs first pass")


def result_of_fresh_process(script: str, args: list[str], env: dict[str, str], timeout: int):
    """Run ``script`` (python -c) with ``args`` in a fresh process whose environment adds ``env`` (settings read
    once per process, e.g. the GDN overrides); the JSON it prints after "RESULT "."""
    result = subprocess.run([sys.executable, "-c", script, *args], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", ["ct-w4a16", "modelopt-mixed"])
def test_qwen3_5_with_volta_gdn_kernels_serves_like_vllms(runs, fmt, mode, triton_allocator):
    """VLLM_VOLTA_FP4_GDN=force: our GDN kernels inside vLLM's GDN layers (plus our GEMMs and attention) against the
    dequantized model on vLLM's own Triton GDN linear. A fresh process: the overrides are registered per process."""
    _, reference, _ = runs.run(runs.dense("qwen3_5", fmt), attention_backend="TRITON_ATTN", **QWEN3_5)
    settings = {**ENGINE, **QWEN3_5, "quantization": "volta_nvfp4", "attention_backend": "CUSTOM",
                "model": str(runs.checkpoint("qwen3_5", fmt)), **MODES[mode]}
    script = (
        "import dataclasses, json, sys\n"
        "from vllm import LLM\n"
        "from vllm_volta_fp4.testing.greedy import generate_with, supported_engine_args\n"
        "from devkit.engine import cuda_graph_modes, engine_model, gdn_layers_on_our_kernels, "
        "use_torch_allocator_for_triton\n"
        "use_torch_allocator_for_triton()\n"
        "llm = LLM(**supported_engine_args(json.loads(sys.argv[1])))\n"
        "layers = gdn_layers_on_our_kernels(engine_model(llm))\n"
        "passes = [generate_with(llm, json.loads(sys.argv[2]), int(sys.argv[3])) for _ in range(2)]\n"
        "passes = [[dataclasses.asdict(g) for g in p] for p in passes]\n"
        "print('RESULT', json.dumps({'layers': layers, 'graphs': cuda_graph_modes(llm), 'passes': passes}))\n"
    )
    outcome = result_of_fresh_process(script, [json.dumps(settings), json.dumps(PROMPTS), str(MAX_TOKENS)],
                                      {"VLLM_VOLTA_FP4_GDN": "force"}, timeout=400)
    assert outcome["layers"] == 3, f"{outcome['layers']} GDN layers run our kernels (the tiny Qwen3.5 has 3)"
    assert_full_decode_graphs(outcome["graphs"], mode, f"qwen3_5 {fmt} our GDN")
    first, second = ([Generation(**g) for g in p] for p in outcome["passes"])
    assert_same_greedy(first, reference, f"qwen3_5 {fmt} our GDN kernels vs vLLM's (dequantized fp16)")
    assert_same_greedy(second, first, f"qwen3_5 {fmt} our GDN kernels, prefix-cache hits vs first pass")


def test_chunked_prefill_matches_unchunked(runs):
    model = runs.checkpoint("qwen3", "ct-w4a16")
    _, chunked, _ = runs.run(model, quantization="volta_nvfp4", attention_backend="CUSTOM")
    _, whole, _ = runs.run(model, quantization="volta_nvfp4", attention_backend="CUSTOM", max_num_batched_tokens=512)
    assert_same_greedy(chunked, whole, "chunked prefill (32-token budget) vs one-step prefill")


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_attention_backend_matches_hugging_face(runs, head_dim):
    """Our attention alone (fp16 dense weights, cuBLAS GEMMs) against Hugging Face's eager attention."""
    model = runs.dense("qwen3", "ct-w4a16", head_dim)
    impls, ours, _ = runs.run(model, attention_backend="CUSTOM")
    assert impls == {VOLTA_IMPL}
    assert_same_greedy(ours, hugging_face_greedy(model), f"head_dim {head_dim}: VOLTA attention vs Hugging Face")


def hugging_face_greedy(model: Path) -> list[Generation]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float16, attn_implementation="eager").cuda()
    results = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt], device="cuda")
        out = hf.generate(ids, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=3)
        logprobs = torch.stack(out.logits).float().log_softmax(-1)[:, 0]  # [steps, vocab]
        top2 = logprobs.topk(2, dim=-1).values
        results.append(Generation(prompt, "", out.sequences[0, ids.shape[1]:].tolist(), top2[:, 0].tolist(),
                                  top2[:, 1].tolist()))
    del hf
    torch.cuda.empty_cache()
    return results


def test_platform_plugin_chooses_volta_attention(runs):
    """Without --attention-backend, the installed platform plugin picks our backend (forced here on a non-Volta GPU;
    on compute capability 7.x it is the default). A fresh process: vLLM resolves its platform once per process."""
    from importlib.metadata import entry_points

    if not any(entry.name == "volta_attention" for entry in entry_points(group="vllm.platform_plugins")):
        pytest.skip("the plugin's entry points are not installed in this environment")
    model = runs.dense("qwen3", "ct-w4a16")
    script = (
        "import json, sys\n"
        "from vllm import LLM\n"
        "from vllm_volta_fp4.testing.greedy import supported_engine_args\nfrom devkit.engine import attention_impls\n"
        "llm = LLM(**supported_engine_args({**json.loads(sys.argv[1]), 'model': sys.argv[2]}))\n"
        "print('RESULT', json.dumps(sorted(attention_impls(llm))))\n"
    )
    impls = result_of_fresh_process(script, [json.dumps(ENGINE), str(model)], {"VLLM_VOLTA_FP4_ATTENTION": "force"},
                                    timeout=300)
    assert impls == [VOLTA_IMPL], impls


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("arch, fmt", [("llama", "modelopt-nvfp4"), ("qwen3", "ct-w4a16"), ("qwen3", "modelopt-mixed")])
def test_tensor_parallel_2_matches_one_gpu(runs, arch, fmt):
    model = runs.checkpoint(arch, fmt)
    _, single, _ = runs.run(model, quantization="volta_nvfp4", attention_backend="CUSTOM")
    _, split, _ = runs.run(model, quantization="volta_nvfp4", attention_backend="CUSTOM", tensor_parallel_size=2)
    assert_same_greedy(split, single, f"{arch} {fmt} tensor parallel 2 vs 1")
