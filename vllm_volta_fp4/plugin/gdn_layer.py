"""Our Gated DeltaNet kernels (vllm_volta_fp4.ops.gdn) inside vLLM's GDN layer, through vLLM's out-of-tree registry.

``VLLM_VOLTA_FP4_GDN``: unset or 1 → on compute capability 7.x (where vLLM's Triton GDN kernels run without tensor
cores), 0 → never, ``force`` → on any CUDA GPU (how the H200 tests them); only fp16 models take our path. Three
classes are registered in ``vllm.model_executor.custom_op.op_registry_oot``, each a subclass of the in-tree class
that overrides one method and calls ``super()`` for everything it does not take:

* the GDN layer (PluggableLayer "gated_delta_net_attention"; 0.32: "qwen_gated_delta_net_attention"):
  ``_forward_core(mixed_qkv, b, a, core_attn_out)``, the body of vLLM's ``gdn_attention_core`` custom op.
  It is the one method that calls the Triton kernels of the non-speculative path (causal_conv1d_fn / _update,
  fused_gdn_gating or fused_post_conv_prep, the chunked rule, fused_sigmoid_gating_delta_rule_update and the
  packed decode), has the same signature and the same metadata fields in 0.19.1, 0.20.2 and 0.32, and runs outside
  torch.compile (inside an opaque custom op), so plain Python dispatch is free there. The functions it calls are
  module globals of vLLM's layer module, which a plugin could only swap by monkeypatching; overriding the method
  instead also lets our ops work on the caches in place (no gather / zero / scatter of the SSM state). Prefill
  and mixed batches: our conv1d prefill, torch gating, our chunked rule on ``ssm_state`` with
  ``non_spec_state_indices_tensor`` / ``has_initial_state``; decode-only batches: our conv1d decode and our
  recurrent decode (l2norm and gating inside the kernel). Speculative decoding, 0.32's prefill checkpoints
  (prefix caching), non-fp16 activations and unsupported shapes go to ``super()``.
* ``ChunkGatedDeltaRule`` (CustomOp "chunk_gated_delta_rule"): ``forward``, for the calls the layer still makes
  to it (vLLM's own path where ours declines, the profile-run warm-up).
* ``RMSNormGated`` (CustomOp "rms_norm_gated"): ``forward``, for the layer's output norm (norm before gate, SiLU
  gate, one group). ``forward`` rather than ``forward_cuda`` because under Inductor vLLM disables custom ops by
  default and would call ``forward_native``.

vLLM looks the registry up by the in-tree *class* name (``PluggableLayer.__new__`` / ``CustomOp.__new__`` use
``cls.__name__``), so the key is e.g. "ChunkGatedDeltaRule", not the op name; ``register_oot`` also renames the
class to that key, so the registered name is restored afterwards (``+chunk_gated_delta_rule`` in
``compilation_config.custom_ops`` keeps its meaning). Everything version-specific (module paths, the padding
slot, the conv-state layout) comes from vllm_volta_fp4.plugin.compat."""

from __future__ import annotations

import logging

import torch

from vllm_volta_fp4 import envs
from vllm_volta_fp4.ops import gdn

logger = logging.getLogger(__name__)

ENABLE_ENV = envs.GDN.name


def choice() -> str:
    """``volta`` (default: compute capability 7.x only), ``force`` (any CUDA GPU) or ``off``, from ENABLE_ENV; any
    other value is an error."""
    return envs.gdn_choice()


_kernels_ready = False
"""Set once by install(): the extension has the GDN ops and CUDA works. A module constant rather than a call, so
that the norm override (inside the torch.compile'd model forward) reads a guarded constant, not the extension."""


def _our_kernels_run(activations: tuple[torch.Tensor, ...], states: tuple[torch.Tensor, ...] = ()) -> bool:
    """Our CUDA ops take these tensors: the extension is built, activations are fp16 on a CUDA device, states
    (fp32 or fp16, checked by the callers) on a CUDA device. The CPU tests replace this predicate to drive the
    same argument translation into the references of vllm_volta_fp4.ops.gdn."""
    return (_kernels_ready and all(t.is_cuda and t.dtype == torch.float16 for t in activations)
            and all(t.is_cuda for t in states))


# ─── The overrides (mixed into the in-tree classes at registration) ─────────────────────────────────────────────


class GdnLayerOverride:
    """``_forward_core`` of vLLM's GDN layer on our ops where they apply (see the module docstring)."""

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor):
        if not self._volta_forward_core(mixed_qkv, b, a, core_attn_out, _layer_metadata(self.prefix)):
            return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        return None

    def _volta_declines(self, mixed_qkv: torch.Tensor, metadata) -> str | None:
        """Why our ops cannot run this batch (None: they can)."""
        if metadata is None:
            return "no metadata (profile run)"
        if metadata.spec_sequence_masks is not None:
            return "speculative decoding"
        if getattr(metadata, "checkpoint", None) is not None:
            return "prefill checkpoints (prefix caching)"
        if metadata.num_prefills == 0 and metadata.num_decodes == 0:
            return "no non-speculative sequences"
        if self.head_k_dim != self.head_v_dim or self.head_k_dim not in gdn.HEAD_DIMS:
            return f"head dims {self.head_k_dim}/{self.head_v_dim}"
        if self.conv1d.weight.shape[-1] not in gdn.CONV_WIDTHS or self.activation not in ("silu", "swish"):
            return f"conv width {self.conv1d.weight.shape[-1]}, activation {self.activation}"
        conv_state, ssm_state = self.kv_cache[0], self.kv_cache[1]
        if conv_state.dtype != mixed_qkv.dtype or ssm_state.dtype not in (torch.float32, torch.float16):
            return f"cache dtypes {conv_state.dtype}, {ssm_state.dtype}"
        if not _our_kernels_run((mixed_qkv, conv_state), (ssm_state,)):
            return "not CUDA fp16 with our extension"
        return None

    def _volta_forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                            core_attn_out: torch.Tensor, metadata) -> bool:
        """Conv1d + gated delta rule of the non-speculative batch into ``core_attn_out``; False (nothing touched)
        where our ops decline the batch."""
        if self._volta_declines(mixed_qkv, metadata) is not None:
            return False
        from vllm_volta_fp4.plugin import compat

        tokens = metadata.num_actual_tokens
        null_slot = compat.gdn_null_slot()
        conv_state = self.kv_cache[0] if compat.gdn_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        ssm_state = self.kv_cache[1]
        weight = self.conv1d.weight.view(self.conv1d.weight.shape[0], self.conv1d.weight.shape[-1])
        conv_args = dict(activation="silu", null_slot=null_slot)
        # With speculative decoding configured, vLLM hands non-speculative batches column 0 of a block table of
        # 1 + K columns (a strided view); our ops take a contiguous vector (a no-op copy otherwise).
        slots = metadata.non_spec_state_indices_tensor.contiguous()
        x, a, b = mixed_qkv[:tokens], a[:tokens], b[:tokens]
        prefill = metadata.num_prefills > 0  # mixed batches too: decodes are one-token sequences of the prefill
        if prefill:
            x = gdn.causal_conv1d_prefill(x, weight, self.conv1d.bias, conv_state, metadata.non_spec_query_start_loc,
                                          slots, metadata.has_initial_state, **conv_args)
        else:
            slots = slots[:tokens]
            x = gdn.causal_conv1d_decode(x, weight, self.conv1d.bias, conv_state, slots, **conv_args)
        d = self.head_k_dim
        v_heads = core_attn_out.shape[1]
        k_width = (x.shape[1] - v_heads * d) // 2
        q = x[:, :k_width].unflatten(1, (-1, d))
        k = x[:, k_width: 2 * k_width].unflatten(1, (-1, d))
        v = x[:, 2 * k_width:].unflatten(1, (v_heads, d))
        out = core_attn_out[:tokens]
        rule_args = dict(scale=d ** -0.5, use_qk_l2norm=True, null_slot=null_slot, out=out)
        if prefill:
            g, beta = gdn.gdn_gating(self.A_log, a, b, self.dt_bias)
            gdn.chunk_gated_delta_rule(q, k, v, g, beta, ssm_state, slots, metadata.non_spec_query_start_loc,
                                       metadata.has_initial_state, **rule_args)
        else:
            gdn.recurrent_gated_delta_rule_decode(q, k, v, a, b, self.A_log, self.dt_bias, ssm_state, slots,
                                                  **rule_args)
        return True


def _layer_metadata(prefix: str):
    """This layer's GDN metadata of the current forward pass (None in a profile run)."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    return metadata.get(prefix) if isinstance(metadata, dict) else None


class ChunkGatedDeltaRuleOverride:
    """``ChunkGatedDeltaRule.forward`` (FLA's ``chunk_gated_delta_rule``: q, k, v, g, beta with a leading batch
    of 1 and ``cu_seqlens``) as our chunked op on a copy of ``initial_state`` with ``state_indices = arange(N)``."""

    def forward(self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                use_qk_l2norm_in_kernel=True, **extra):
        # chunk_indices / chunk_offsets (0.20+) are FLA's own chunk bookkeeping; anything else (0.32's in-place
        # core_attn_out, AITER metadata) is vLLM's
        ours = (cu_seqlens is not None and q.shape[0] == 1 and initial_state is not None
                and all(value is None for key, value in extra.items() if key not in ("chunk_indices", "chunk_offsets"))
                and q.shape[-1] == v.shape[-1] and q.shape[-1] in gdn.HEAD_DIMS
                and initial_state.dtype in (torch.float32, torch.float16)
                and _our_kernels_run((q, k, v), (initial_state,)))
        if not ours:
            return super().forward(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **extra)
        state = initial_state.clone()  # FLA leaves initial_state alone and returns the final state
        slots = torch.arange(cu_seqlens.numel() - 1, dtype=torch.int32, device=state.device)
        o = gdn.chunk_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], state, slots, cu_seqlens,
                                       use_qk_l2norm=bool(use_qk_l2norm_in_kernel))
        return o.unsqueeze(0), (state if output_final_state else None)


class RMSNormGatedOverride:
    """``RMSNormGated.forward`` as our gated RMSNorm where the configuration is the GDN layer's."""

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        d = self.weight.shape[0]
        ours = (z is not None and self.norm_before_gate and self.group_size in (None, d)
                and self.activation in ("silu", "swish") and getattr(self, "bias", None) is None
                and x.shape[-1] == d and d in gdn.HEAD_DIMS and z.shape == x.shape and _our_kernels_run((x, z)))
        if not ours:
            return super().forward(x, z)
        return gdn.gated_rms_norm(x, z, self.weight, self.eps)


# ─── Registration ──────────────────────────────────────────────────────────────────────────────────────────────


def register_gdn() -> bool:
    """Called by register_with_vllm(): install the overrides where ENABLE_ENV and the GPU ask for them. Imports
    nothing from vLLM when switched off. Returns whether they are installed."""
    wanted = choice()
    if wanted == "off":
        return False
    from vllm_volta_fp4.plugin import compat

    capability = compat.device_capability()
    if capability is None:
        if wanted == "force":
            logger.info("%s=force but the platform is not CUDA: vLLM's GDN kernels stay", ENABLE_ENV)
        return False
    if wanted == "volta" and capability // 10 != 7:
        return False
    return install()


def install() -> bool:
    """Register the three overrides in vLLM's out-of-tree registry (idempotent); False, with a warning, where the
    installed vLLM has no GDN layer we know or another plugin already replaced one of the classes."""
    from vllm_volta_fp4.plugin import compat

    hooks = compat.gdn_hook_classes()
    if hooks is None:
        logger.warning("%s: this vLLM has no GDN layer with _forward_core; vLLM's GDN kernels stay", ENABLE_ENV)
        return False
    global _kernels_ready
    _kernels_ready = gdn.kernels_available()
    if not _kernels_ready:
        logger.warning("%s: vllm_volta_fp4._C has no GDN ops or CUDA is unusable; vLLM's kernels will run", ENABLE_ENV)
    layer, op, norm = hooks
    return all([_register(layer, GdnLayerOverride), _register(op, ChunkGatedDeltaRuleOverride),
                _register(norm, RMSNormGatedOverride)])


def _register(base: type, override: type) -> bool:
    from vllm.model_executor.custom_op import op_registry_oot

    current = op_registry_oot.get(base.__name__)
    if current is not None:
        if getattr(current, "volta_fp4_override", None) is override:
            return True
        logger.warning("%s: %s is already replaced by %s; not replacing it", ENABLE_ENV, base.__name__, current)
        return False
    in_tree_name = getattr(base, "name", None)
    cls = type(f"Volta{base.__name__}", (override, base), {"__module__": __name__, "volta_fp4_override": override})
    base.register_oot(cls)  # the key is base.__name__, the name vLLM's __new__ looks up
    if in_tree_name is not None:
        cls.name = in_tree_name
    logger.info("%s: vLLM's %s runs vllm_volta_fp4's GDN kernels where they apply", ENABLE_ENV, base.__name__)
    return True
