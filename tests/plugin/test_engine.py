"""A real vLLM engine on this CPU: every checkpoint format through ``quantization="volta_nvfp4"`` gives the same
greedy tokens as the dequantized model run unquantized by the same engine; vLLM's default mode (torch.compile:
Dynamo traces the plugin's linear methods with fullgraph) gives the eager tokens; the OpenAI server (default mode)
answers, also under 32 concurrent requests; tensor parallel 2 matches tensor parallel 1."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import CPU_ENGINE_ENV as ENV
from tests.conftest import requires_vllm
from vllm_volta_fp4.testing.greedy import DEFAULT_PROMPTS
from vllm_volta_fp4.testing.tiny_model import FORMATS, make_tiny_checkpoint
from vllm_volta_fp4.toolkit.convert import convert_to_dense

pytestmark = [pytest.mark.engine, requires_vllm]

MAX_TOKENS = 32
NVFP4_FAMILY = ("modelopt-nvfp4", "modelopt-w4a16", "ct-w4a16", "ct-w4a4")
ENGINE = {"dtype": "float32"}
QUANTIZED = {**ENGINE, "quantization": "volta_nvfp4"}
# greedy.greedy_generate runs eager unless told otherwise; vLLM's default mode on CPU compiles with torch.compile
# (no CUDA graphs here), which is where the plugin once crashed at start-up.
DEFAULT_MODE = {**QUANTIZED, "enforce_eager": False}
DEFAULT_MODE_RUNS = ("modelopt-mixed", "qwen3")  # FP8 and NVFP4 linear methods; both architectures
NO_COMPILE_CACHE = {"VLLM_DISABLE_COMPILE_CACHE": "1"}  # trace every time: a cached graph would hide a trace failure


def _tensors(directory):
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for file in sorted(set(index.values())):
        tensors.update(load_file(directory / file))
    return tensors


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_checkpoints):
    """Quantized checkpoints and their dequantized references. The four NVFP4-only formats hold the same
    weights, so one dense reference serves them all — checked here, not assumed."""
    root = tmp_path_factory.mktemp("engine")
    dense = {fmt: convert_to_dense(tiny_checkpoints[fmt], root / f"{fmt}-dense", dtype=torch.float32)
             for fmt in FORMATS}
    family_reference = _tensors(dense["modelopt-nvfp4"])
    for fmt in NVFP4_FAMILY[1:]:
        other = _tensors(dense[fmt])
        assert other.keys() == family_reference.keys()
        for name, tensor in other.items():  # the compressed-tensors scale is stored inverted: ≤ 1 ulp apart
            assert torch.allclose(tensor, family_reference[name], rtol=3e-7, atol=0), (fmt, name)
    qwen = make_tiny_checkpoint(root / "qwen3-ct-w4a16", "qwen3", "ct-w4a16")
    return {"quantized": dict(tiny_checkpoints), "dense": dense, "qwen3": qwen,
            "qwen3-dense": convert_to_dense(qwen, root / "qwen3-dense", dtype=torch.float32)}


@pytest.fixture(scope="module")
def generations(models, tmp_path_factory):
    """One subprocess runs every engine one after the other (a spawned vLLM engine needs a __main__ guard)."""
    runs = [{"name": fmt, "model": str(path), "engine_args": QUANTIZED} for fmt, path in models["quantized"].items()]
    runs += [{"name": "dense-nvfp4", "model": str(models["dense"]["modelopt-nvfp4"]), "engine_args": ENGINE},
             {"name": "dense-mixed", "model": str(models["dense"]["modelopt-mixed"]), "engine_args": ENGINE},
             {"name": "qwen3", "model": str(models["qwen3"]), "engine_args": QUANTIZED},
             {"name": "dense-qwen3", "model": str(models["qwen3-dense"]), "engine_args": ENGINE},
             # vLLM's CPU backend binds each tensor-parallel worker to its own cores; one NUMA node needs it spelled
             {"name": "tp2", "model": str(models["quantized"]["modelopt-nvfp4"]),
              "engine_args": {**QUANTIZED, "tensor_parallel_size": 2}, "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}}]
    checkpoints = {**models["quantized"], "qwen3": models["qwen3"]}
    runs += [{"name": f"{name}-default-mode", "model": str(checkpoints[name]), "engine_args": DEFAULT_MODE,
              "env": NO_COMPILE_CACHE} for name in DEFAULT_MODE_RUNS]
    work = tmp_path_factory.mktemp("generations")
    spec, out = work / "spec.json", work / "out.json"
    spec.write_text(json.dumps({"runs": runs, "prompts": DEFAULT_PROMPTS, "max_tokens": MAX_TOKENS}))
    result = subprocess.run([sys.executable, "-m", "vllm_volta_fp4.testing.greedy", str(spec), str(out)], env=ENV,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


def _assert_same_generation(ours, reference, label):
    assert len(ours) == len(reference) == len(DEFAULT_PROMPTS)
    for mine, theirs in zip(ours, reference, strict=True):
        assert len(mine["token_ids"]) == MAX_TOKENS, label
        assert mine["token_ids"] == theirs["token_ids"], (label, mine["prompt"])
        gap = max(abs(a - b) for a, b in zip(mine["logprobs"], theirs["logprobs"], strict=True))
        assert gap < 1e-3, (label, mine["prompt"], gap)


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_tokens_identical_to_the_dequantized_model(generations, fmt):
    reference = generations["dense-mixed" if fmt == "modelopt-mixed" else "dense-nvfp4"]
    _assert_same_generation(generations[fmt], reference, fmt)


def test_qwen3_architecture_matches_too(generations):
    _assert_same_generation(generations["qwen3"], generations["dense-qwen3"], "qwen3")


@pytest.mark.parametrize("name", DEFAULT_MODE_RUNS)
def test_default_mode_matches_eager(generations, name):
    _assert_same_generation(generations[f"{name}-default-mode"], generations[name], f"{name} default mode")


def test_tensor_parallel_2_matches_tensor_parallel_1(generations):
    _assert_same_generation(generations["tp2"], generations["modelopt-nvfp4"], "tp2")


def test_the_model_is_not_trivially_repetitive(generations):
    """Token identity proves little if every run emits one token forever."""
    for generation in generations["dense-nvfp4"]:
        assert len(set(generation["token_ids"])) >= 4


def _client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)


def _complete(client, model, prompt):
    response = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"ignore_eos": True})
    return response.choices[0].text, response.usage.completion_tokens


def test_server_completions_match_offline_greedy(openai_server, generations):
    client, model = _client(openai_server), openai_server.model
    for expected in generations["modelopt-nvfp4"]:
        text, count = _complete(client, model, expected["prompt"])
        assert count == MAX_TOKENS and text == expected["text"]


def test_server_chat_completions_apply_the_chat_template(openai_server):
    client, model = _client(openai_server), openai_server.model
    question = "what is the kv cache"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                          max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    content = chat.choices[0].message.content
    assert chat.usage.completion_tokens == MAX_TOKENS and content
    rendered = f"<|im_start|>user\n{question}<|endoftext|>\n<|im_start|>assistant\n"
    assert _complete(client, model, rendered)[0] == content


def test_32_concurrent_requests_are_all_answered_correctly(openai_server, generations):
    client, model = _client(openai_server), openai_server.model
    expected = {g["prompt"]: g["text"] for g in generations["modelopt-nvfp4"]}
    prompts = [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(32)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda prompt: _complete(client, model, prompt), prompts))
    wrong = [(prompt, text) for prompt, (text, _) in zip(prompts, answers, strict=True) if text != expected[prompt]]
    assert not wrong, wrong[:3]
    assert all(count == MAX_TOKENS for _, count in answers)
