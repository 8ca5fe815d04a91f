"""volta-fp4 plan: the Qwen3.8-27B numbers against a hand computation from the model's published shape, exact
checkpoint bytes for a model directory, tensor parallelism, the fit verdict, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from vllm_volta_fp4.cli import main
from vllm_volta_fp4.format.checkpoint import NVFP4, Checkpoint
from vllm_volta_fp4.toolkit.planner import (
    PlanError,
    ServeRequest,
    activation_bytes,
    format_plan,
    model_shape,
    mtp_linear_shapes,
    parse_gpu,
    plan_for,
    plan_memory,
    read_config,
    weights_from_checkpoint,
    weights_from_config,
)

QWEN = Path(__file__).parents[1] / "data" / "qwen3.8-27b-config.json"

# The hand computation, from the published shape (tests/data/qwen3.8-27b-config.json says the same in JSON).
H, I, V = 5120, 17408, 248320
Q_HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256
FULL_LAYERS, GDN_LAYERS = 16, 48
GDN_K_HEADS, GDN_V_HEADS, GDN_K_DIM, GDN_V_DIM, CONV_KERNEL = 16, 48, 128, 128, 4


def hand_linear_params() -> int:
    attention = (2 * Q_HEADS * HEAD_DIM * H  # q_proj with the output gate
                 + 2 * KV_HEADS * HEAD_DIM * H  # k_proj, v_proj
                 + H * Q_HEADS * HEAD_DIM)  # o_proj
    key_dim, value_dim = GDN_K_HEADS * GDN_K_DIM, GDN_V_HEADS * GDN_V_DIM
    gdn = ((2 * key_dim + value_dim) * H  # in_proj_qkv
           + value_dim * H  # in_proj_z
           + 2 * GDN_V_HEADS * H  # in_proj_b, in_proj_a
           + H * value_dim)  # out_proj
    mlp = 3 * H * I
    return FULL_LAYERS * attention + GDN_LAYERS * gdn + (FULL_LAYERS + GDN_LAYERS) * mlp


def qwen_plan(**request):
    defaults = {"gpu": parse_gpu("v100-32gb"), "max_model_len": 32768}
    return plan_for(QWEN, ServeRequest(**{**defaults, **request}))


def test_weights_match_the_hand_computation():
    plan = qwen_plan()
    weights = plan.weights
    params = hand_linear_params()
    assert abs(params - 24.4e9) / 24.4e9 < 0.01  # the model card's "~24.4 B linear parameters"
    # the real exclusions ("*linear_attn.in_proj_ba*", vLLM's fused name) keep the GDN b/a projections in fp16
    b_a = 2 * GDN_V_HEADS * H * GDN_LAYERS
    assert weights.nvfp4_params == params - b_a
    # 4 bits per value + one E4M3 byte per 16 values + one fp32 global scale per matrix (5 per decoder layer)
    matrices = FULL_LAYERS * 4 + GDN_LAYERS * 3 + (FULL_LAYERS + GDN_LAYERS) * 3
    assert weights.nvfp4 == (params - b_a) // 2 + (params - b_a) // 16 + 4 * matrices
    assert abs(weights.nvfp4 - 13.7e9) / 13.7e9 < 0.01  # "~13.7 GB at 4.5 bit"
    assert weights.fp16_linear == (V * H + b_a) * 2  # lm_head "~2.5 GB fp16" and the b/a projections
    assert weights.fp16_linear_modules[-1] == "lm_head" and len(weights.fp16_linear_modules) == 1 + 2 * GDN_LAYERS
    assert weights.embeddings == V * H * 2
    assert weights.fp8 == 0 and not weights.exact


def test_kv_cache_and_recurrent_state_match_the_hand_computation():
    plan = qwen_plan()
    assert plan.kv_bytes_per_token == FULL_LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # K and V, fp16, full layers only
    conv = (2 * GDN_K_HEADS * GDN_K_DIM + GDN_V_HEADS * GDN_V_DIM) * (CONV_KERNEL - 1) * 2
    recurrent = GDN_V_HEADS * GDN_K_DIM * GDN_V_DIM * 2
    assert plan.state_bytes_per_sequence == GDN_LAYERS * (conv + recurrent)
    assert plan.bytes_per_full_sequence == plan.kv_bytes_per_token * 32768 + plan.state_bytes_per_sequence


def test_v100_32gb_at_32k_fits_with_flags_that_say_so():
    plan = qwen_plan()
    budget = int(parse_gpu("v100-32gb").total_bytes * plan.gpu_memory_utilization)
    assert plan.kv_space_bytes == budget - plan.fixed_bytes
    assert plan.fits and plan.full_length_sequences == plan.kv_space_bytes // plan.bytes_per_full_sequence
    assert plan.max_num_seqs == plan.full_length_sequences  # default: all of them can reach max-model-len
    flags = plan.vllm_flags()
    assert flags[flags.index("--max-model-len") + 1] == "32768"
    assert flags[flags.index("--gpu-memory-utilization") + 1] == f"{plan.gpu_memory_utilization:.2f}"
    assert flags[flags.index("--quantization") + 1] == "volta_nvfp4" and "half" in flags


def test_longest_fitting_length_is_the_boundary():
    too_long = qwen_plan(max_model_len=262144)
    assert not too_long.fits and too_long.longest_fitting_len > 32768
    assert qwen_plan(max_model_len=too_long.longest_fitting_len).fits
    assert not qwen_plan(max_model_len=too_long.longest_fitting_len + 2048).fits


def test_16gb_v100_cannot_hold_the_weights_but_two_can():
    alone = qwen_plan(gpu=parse_gpu("v100-16gb"))
    assert not alone.fits and alone.weights_per_gpu > parse_gpu("v100-16gb").total_bytes * 0.95
    pair = qwen_plan(gpu=parse_gpu("v100-16gb"), tensor_parallel=2)
    assert pair.weights_per_gpu < alone.weights_per_gpu * 0.51
    assert pair.kv_bytes_per_token == alone.kv_bytes_per_token // 2  # 4 KV heads split over 2 GPUs


def test_kv_heads_are_replicated_past_their_count():
    eight = qwen_plan(tensor_parallel=8)
    assert eight.kv_bytes_per_token == FULL_LAYERS * 2 * 1 * HEAD_DIM * 2  # 4 KV heads cannot split 8 ways


def test_activations_grow_with_the_prefill_chunk():
    shape = model_shape(*read_config(QWEN))
    small, large = activation_bytes(shape, 1024, 1, 1), activation_bytes(shape, 4096, 1, 1)
    assert large > 3 * small
    assert qwen_plan(max_num_batched_tokens=8192).activation_bytes > qwen_plan().activation_bytes


def test_enforce_eager_frees_the_cuda_graph_pool():
    # the same sequence count in both (it sizes the logits buffer), so only the graph pool differs
    eager, graphs = qwen_plan(enforce_eager=True, max_num_seqs=4), qwen_plan(max_num_seqs=4)
    assert eager.cuda_graph_bytes == 0 < graphs.cuda_graph_bytes
    assert eager.kv_space_bytes - graphs.kv_space_bytes == graphs.cuda_graph_bytes
    assert "--enforce-eager" in eager.vllm_flags()


def test_flat_config_layer_types_and_interval_give_the_same_plan(tmp_path):
    config = json.loads(QWEN.read_text())
    flat = {**config["text_config"], "architectures": config["architectures"], "tie_word_embeddings": False,
            "quantization_config": config["quantization_config"]}
    del flat["layer_types"]  # full_attention_interval alone must give the same layer pattern
    (tmp_path / "config.json").write_text(json.dumps(flat))
    nested, plain = qwen_plan(), plan_for(tmp_path, ServeRequest(parse_gpu("v100-32gb"), 32768))
    assert plain.weights.nvfp4 == nested.weights.nvfp4
    assert (plain.kv_bytes_per_token, plain.state_bytes_per_sequence) == (nested.kv_bytes_per_token,
                                                                         nested.state_bytes_per_sequence)


def test_quantization_config_in_the_config_decides_each_matrix(tmp_path):
    config = json.loads(QWEN.read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "exclude_modules": ["lm_head", "*linear_attn.in_proj_b", "*linear_attn.in_proj_a"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = weights_from_config(model_shape(config, tmp_path / "config.json"))
    excluded = 2 * GDN_V_HEADS * H * GDN_LAYERS
    assert weights.nvfp4_params == hand_linear_params() - excluded
    assert weights.fp16_linear_params == V * H + excluded


def test_model_directory_weights_are_exact_header_bytes(tiny_checkpoints):
    model_dir = tiny_checkpoints["modelopt-mixed"]
    weights = weights_from_checkpoint(model_dir)
    stored, nvfp4 = 0, 0
    schemes = Checkpoint(model_dir).validate()
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                size = tensor.numel() * tensor.element_size()  # tiny models store float tensors in fp16
                stored += size
                scheme = schemes.get(name.rpartition(".")[0])
                nvfp4 += size if scheme is not None and scheme.kind == NVFP4 else 0
    assert weights.exact and weights.total == stored and weights.nvfp4 == nvfp4
    assert weights.fp8 > 0 and weights.fp16_linear_modules == ["lm_head"]
    plan = plan_memory(model_shape(*read_config(model_dir)), weights, ServeRequest(parse_gpu("2"), 1024))
    assert plan.fits and plan.weights_per_gpu == stored


@pytest.mark.parametrize("gpu, message", [("a100", "expected v100-32gb"), ("-3", "positive")])
def test_bad_gpu_is_a_clear_error(gpu, message):
    with pytest.raises(PlanError, match=message):
        parse_gpu(gpu)


def test_bad_configs_are_clear_errors(tmp_path):
    with pytest.raises(PlanError, match="not found"):
        read_config(tmp_path / "missing")
    config = json.loads(QWEN.read_text())["text_config"]
    del config["linear_num_value_heads"]
    with pytest.raises(PlanError, match="linear_num_value_heads"):
        model_shape(config, tmp_path / "config.json")
    with pytest.raises(PlanError, match="mixture-of-experts"):
        model_shape({**config, "num_experts": 128}, tmp_path / "config.json")
    with pytest.raises(PlanError, match="max-model-len"):
        ServeRequest(parse_gpu("v100-32gb"), 0)


def test_cli_prints_the_plan_and_exits_by_verdict(capsys):
    assert main(["plan", str(QWEN), "--gpu", "v100-32gb", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "verdict: FITS" in out and "--max-model-len 32768" in out and "estimate" in out
    assert main(["plan", str(QWEN), "--gpu", "v100-16gb", "--max-model-len", "32768"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["plan", str(QWEN), "--gpu", "h100", "--max-model-len", "32768"]) == 2
    assert "expected v100-32gb" in capsys.readouterr().err



def hand_mtp_params() -> int:
    attention = 2 * Q_HEADS * HEAD_DIM * H + 2 * KV_HEADS * HEAD_DIM * H + H * Q_HEADS * HEAD_DIM
    return H * 2 * H + attention + 3 * H * I  # fc, one full-attention layer, its MLP


def test_mtp_costs_its_weights_and_one_layers_kv_only_when_speculating(capsys):
    plain, speculating = qwen_plan(), qwen_plan(speculative_tokens=3)
    mtp = plain.mtp
    # "*mtp*" is excluded, so its 16-bit matrices are what the drafter quantizes (FP8 by default): a byte per weight
    # and a float32 scale per row
    assert mtp.weights.fp8_params == hand_mtp_params()
    assert mtp.weights.fp16_linear_params == mtp.weights.nvfp4_params == 0
    assert mtp.weights.fp8 == hand_mtp_params() + sum(4 + 4 * rows for _, rows, _ in mtp_linear_shapes(plain.shape))
    assert mtp.kv_bytes_per_token == 2 * KV_HEADS * HEAD_DIM * 2  # one full-attention layer, fp16 K and V
    assert mtp.draft_head_bytes == V * H + 4 + 4 * V  # the drafts' FP8 lm_head copy, likewise
    assert speculating.weights_per_gpu - plain.weights_per_gpu == mtp.weights.total + mtp.draft_head_bytes
    assert speculating.kv_bytes_per_token - plain.kv_bytes_per_token == mtp.kv_bytes_per_token
    assert '{"method": "mtp", "num_speculative_tokens": 3}' in speculating.vllm_flags()
    assert main(["plan", str(QWEN), "--gpu", "v100-32gb", "--max-model-len", "32768", "--speculative-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "MTP module (1 full-attention layer(s), FP8)" in out and "counted above" in out
    assert "FP8 lm_head copy for the drafts" in out
    assert "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'" in out


def test_the_drafter_weights_are_counted_in_their_format():
    fp8, nvfp4, off = (qwen_plan(speculative_tokens=3, draft_format=fmt) for fmt in ("fp8", "nvfp4", None))
    assert off.mtp.draft_head_bytes == 0 and "lm_head copy" not in format_plan(off)
    assert off.mtp.weights.fp16_linear == hand_mtp_params() * 2 and "layer(s), fp16)" in format_plan(off)
    assert nvfp4.mtp.draft_head_bytes == V * H * 9 // 16 + 4 + 4 * V  # 4.5 bits per weight + row scales
    assert nvfp4.mtp.weights.nvfp4_params == hand_mtp_params()
    assert "NVFP4 lm_head copy for the drafts" in format_plan(nvfp4)
    assert off.mtp.weights.total > fp8.mtp.weights.total > nvfp4.mtp.weights.total  # the layers shrink in place
    for plan in (fp8, nvfp4):
        assert plan.weights_per_gpu - off.weights_per_gpu == (plan.mtp.weight_bytes - off.mtp.weight_bytes)


def test_speculating_without_an_mtp_module_is_a_clear_error(tmp_path):
    config = json.loads(QWEN.read_text())
    del config["text_config"]["mtp_num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert plan_for(tmp_path, ServeRequest(parse_gpu("v100-32gb"), 4096)).mtp is None
    with pytest.raises(PlanError, match="no MTP module"):
        plan_for(tmp_path, ServeRequest(parse_gpu("v100-32gb"), 4096, speculative_tokens=1))


def test_checkpoint_weights_leave_the_mtp_module_to_the_speculation_line(mtp_checkpoints):
    model_dir = mtp_checkpoints[("ct-w4a16", "unquantized")]
    weights = weights_from_checkpoint(model_dir)
    assert not any(module.startswith("mtp.") for module in weights.fp16_linear_modules)
    plan = plan_for(model_dir, ServeRequest(parse_gpu("2"), 1024, speculative_tokens=1, draft_format=None))
    assert plan.mtp is not None and plan.mtp.weights.fp16_linear_params > 0


def test_the_vision_tower_is_counted_unless_text_only():
    """Qwen3.8-27B's 27-block vision tower: ~0.9 GiB in fp16, which vLLM loads unless --language-model-only."""
    full, text_only = qwen_plan(), qwen_plan(language_model_only=True)
    assert abs(full.weights.vision / 2**30 - 0.89) < 0.02
    assert full.weights_per_gpu - text_only.weights_per_gpu == full.weights.vision
    assert "--language-model-only" in text_only.vllm_flags() and "--language-model-only" not in full.vllm_flags()
    assert "--language-model-only leaves it out" in format_plan(full)


@pytest.mark.parametrize("tp, words", [(3, "4 KV heads"), (3, "intermediate size 17408"), (5, "24 attention heads")])
def test_a_tensor_parallel_size_that_does_not_divide_the_model_is_refused(tp, words):
    with pytest.raises(PlanError, match=words):
        qwen_plan(tensor_parallel=tp)
