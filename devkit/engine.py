"""Helpers that reach into a running vLLM engine, for the end-to-end tests and the throughput benchmark."""

from __future__ import annotations

from vllm_volta_fp4.plugin import gdn_layer


def use_torch_allocator_for_triton() -> None:
    """Give Triton a scratch-memory allocator (torch's caching allocator). vLLM's Triton GDN kernels (FLA) ask for
    scratch memory; vLLM 0.20 installs an allocator for some models only, 0.19.1 relies on its own pinned Triton,
    which a newer Triton (the GPU kit's) replaces."""
    import triton

    if hasattr(triton, "set_allocator"):
        import torch

        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _model_runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def engine_model(llm):
    """The model module an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor parallel 1) runs; None when
    it cannot be reached from here."""
    try:
        return _model_runner(llm).model
    except AttributeError:
        return None


def drafter_model(llm):
    """The speculative drafter's model module of an in-process engine (see engine_model); None without one."""
    try:
        return _model_runner(llm).drafter.model
    except AttributeError:
        return None


DRAFT_FORMATS = ("fp8", "nvfp4", "fp16")  # the MTP drafter's weights: the plugin's quantizations, or as loaded


def use_draft_format(fmt: str) -> None:
    """The MTP drafter's weight format (one of DRAFT_FORMATS) of the next engine started in this process (the
    drafter reads VLLM_VOLTA_FP4_DRAFT_WEIGHTS when it loads)."""
    import os

    from vllm_volta_fp4 import envs

    if fmt not in DRAFT_FORMATS:
        raise ValueError(f"drafter weights {fmt!r}: expected one of {DRAFT_FORMATS}")
    os.environ[envs.DRAFT_WEIGHTS.name] = "0" if fmt == "fp16" else fmt


def drafter_format(llm) -> str | None:
    """Which of DRAFT_FORMATS an in-process engine's drafter runs with — its lm_head copy and the layers it
    quantized in place ("fp16": no copy, or a 16-bit layer left); "mixed fp16+fp8" and the like when they differ;
    None without a drafter."""
    from vllm_volta_fp4.plugin.models.draft_weights import DraftLinearMethod, sixteen_bit_layers

    drafter = drafter_model(llm)
    if drafter is None:
        return None
    copy = drafter._modules.get("draft_head")  # plugin/models/draft_weights.py registers it when it makes one
    formats = {copy.fmt if copy is not None else "fp16"}
    formats |= {module.quant_method.fmt for module in drafter.modules()
                if isinstance(getattr(module, "quant_method", None), DraftLinearMethod)}
    if sixteen_bit_layers(drafter):
        formats.add("fp16")
    return formats.pop() if len(formats) == 1 else "mixed " + "+".join(sorted(formats))


def cuda_graph_modes(llm) -> dict[str, object]:
    """What an in-process engine's model runner settled on for CUDA graphs: ``mode`` (the CUDAGraphMode name after
    vLLM's downgrades for the attention backends' support) and how many FULL and PIECEWISE graphs its dispatcher
    holds (``full``, ``piecewise``). Empty where the runner cannot be reached (see engine_model)."""
    try:
        runner = _model_runner(llm)
    except AttributeError:
        return {}
    from vllm.config import CUDAGraphMode

    keys = getattr(runner.cudagraph_dispatcher, "cudagraph_keys", {})
    return {"mode": runner.compilation_config.cudagraph_mode.name,
            "full": len(keys.get(CUDAGraphMode.FULL, ())), "piecewise": len(keys.get(CUDAGraphMode.PIECEWISE, ()))}


def attention_impls(llm) -> set[str]:
    """Class names of the attention implementations an in-process engine really runs; empty when they cannot be
    reached from here (see engine_model)."""
    model = engine_model(llm)
    if model is None:
        return set()
    from torch import nn

    return {type(module.impl).__name__ for module in model.modules()
            if isinstance(module, nn.Module) and hasattr(module, "impl") and hasattr(module.impl, "forward")}


def gdn_layers_on_our_kernels(model) -> int:
    """How many GDN layers of a model module (e.g. engine_model's) are our override."""
    return sum(isinstance(module, gdn_layer.GdnLayerOverride) for module in model.modules())


def uninstall_gdn_overrides() -> None:
    """Remove our classes from vLLM's out-of-tree registry (tests)."""
    from vllm.model_executor.custom_op import op_registry_oot

    for key, cls in list(op_registry_oot.items()):
        if getattr(cls, "volta_fp4_override", None) is not None:
            del op_registry_oot[key]


SPEC_DECODE_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_decode_counters(llm) -> dict[str, float | list[float]]:
    """vLLM's speculative-decoding counters of an engine started with ``disable_log_stats=False`` (summed over its
    engine labels): drafts (= verification rounds), draft tokens, accepted tokens, and ``per_position``, the
    accepted drafts per draft position."""
    counts: dict[str, float | list[float]] = dict.fromkeys(SPEC_DECODE_COUNTERS, 0.0)
    per_position: list[float] = []
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name in SPEC_DECODE_COUNTERS:
            counts[name] += metric.value
        elif name == "num_accepted_tokens_per_pos":
            values = metric.values if hasattr(metric, "values") else [metric.value]
            per_position = [a + b for a, b in zip(per_position or [0.0] * len(values), values, strict=True)]
    return {**counts, "per_position": per_position}
