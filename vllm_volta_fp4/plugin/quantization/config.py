"""The ``volta_nvfp4`` quantization config: NVFP4 (ModelOpt and compressed-tensors, mixed FP8 too) on sm_70+."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vllm_volta_fp4 import envs
from vllm_volta_fp4.format.checkpoint import (
    FP8,
    MODELOPT,
    NVFP4,
    Checkpoint,
    CheckpointError,
    QuantFormat,
    parse_quant_config,
)
from vllm_volta_fp4.plugin.compat import (
    LinearBase,
    QuantizationConfig,
    UnquantizedLinearMethod,
    device_capability,
    get_current_vllm_config_or_none,
    is_cpu_platform,
    plugin_logger,
)

logger = plugin_logger(__name__)

NAME = "volta_nvfp4"
STOCK_NVFP4_MIN_CAPABILITY = 75
"""Below this stock vLLM refuses NVFP4, so the plugin claims such checkpoints without being asked."""


class CheckpointRefused(RuntimeError):
    """A checkpoint volta_nvfp4 will not load; the message is the one line the user needs. Not a ValueError, so
    vLLM's pydantic config validation passes it on as it is instead of wrapping it in a ValidationError."""

    def __init__(self, error: CheckpointError):
        super().__init__(f"volta_nvfp4 cannot serve this checkpoint: {error}")
        self.checkpoint_error = error


def _recognise(hf_quant_cfg: dict[str, Any] | None, where: str = "quantization config") -> QuantFormat | None:
    """The checkpoint's format if it is one we serve (NVFP4, possibly mixed with FP8 layers), else None."""
    if not hf_quant_cfg:
        return None
    try:
        return parse_quant_config(hf_quant_cfg, where)
    except CheckpointError:
        return None


def _quant_config_file(hf_config) -> str:
    """Where vLLM read the quantization config from, as well as can be told (0.19.1 passes no hf_config)."""
    model_dir = Path(str(getattr(hf_config, "name_or_path", "") or ""))
    if str(model_dir) and model_dir.is_dir():
        legacy = model_dir / "hf_quant_config.json"
        return str(legacy if legacy.exists() else model_dir / "config.json")
    return "the checkpoint's quantization config"


class VoltaNvfp4Config(QuantizationConfig):
    """Serves NVFP4 weights as W4A16 (and FP8 layers as W8A16) with fp16 activations."""

    def __init__(self, quant_format: QuantFormat):
        super().__init__()
        self.quant_format = quant_format
        if any(scheme.quantized_activations for scheme in self._all_schemes()):
            logger.info("volta_nvfp4: the checkpoint also quantizes activations (W4A4/W8A8); its input scales are "
                        "read and ignored, and activations stay fp16 (Volta has no FP4/FP8 arithmetic)")

    def _all_schemes(self):
        fmt = self.quant_format
        return [fmt.default_scheme, *fmt.layer_schemes.values(), *(scheme for _, scheme in fmt.target_groups)]

    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VoltaNvfp4Config:
        try:
            return cls(parse_quant_config(config))
        except CheckpointError as error:
            raise CheckpointRefused(error) from None

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        """Claim NVFP4 checkpoints when asked for by name, or unasked on GPUs where stock vLLM cannot run them."""
        if user_quant == NAME:  # asked for by name: a config we cannot serve is refused here, with the reason
            try:
                parse_quant_config(hf_quant_cfg or {}, _quant_config_file(hf_config))
            except CheckpointError as error:
                raise CheckpointRefused(error) from None
            return NAME
        if user_quant is not None or _recognise(hf_quant_cfg) is None:
            return None
        capability = device_capability()
        if capability is not None and capability < STOCK_NVFP4_MIN_CAPABILITY:
            logger.info("volta_nvfp4: compute capability %d.%d cannot run stock NVFP4; serving this checkpoint with "
                        "volta_nvfp4", capability // 10, capability % 10)
            return NAME
        if is_cpu_platform():
            raise ValueError(
                "This is an NVFP4 checkpoint, which vLLM's CPU backend cannot run by itself. Pass "
                f"--quantization {NAME} (or LLM(..., quantization=\"{NAME}\")) to run it with the vllm-volta-fp4 "
                "reference kernels.")
        return None

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None) -> None:
        """vLLM calls this (every version, any signature) while building its config, before any weight is read:
        the checkpoint is validated here, so a damaged one ends in one clear error instead of wrong tokens."""
        validate_before_loading(model_name, revision)

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        """Rename the checkpoint-side module names the config refers to into vLLM's module names."""
        fmt = self.quant_format
        if fmt.exclude:
            fmt.exclude = hf_to_vllm_mapper.apply_list(fmt.exclude)
        if fmt.layer_schemes:
            renamed = hf_to_vllm_mapper.apply_list(list(fmt.layer_schemes))
            fmt.layer_schemes = dict(zip(renamed, fmt.layer_schemes.values(), strict=True))

    def _left_unquantized(self, prefix: str) -> bool:
        """Layers stored in 16 bits whatever their shards say: those the exclusions name by vLLM's fused name (real
        exports list "*linear_attn.in_proj_ba*"), and the MTP module's fc of ModelOpt exports, which ModelOpt keeps
        in 16 bits without always listing it (vLLM >= 0.20 forces it unquantized for modelopt_fp4 likewise)."""
        if self.quant_format.is_excluded(prefix):
            return True
        is_mtp_fc = prefix == "mtp.fc" or prefix.endswith(".mtp.fc")
        return is_mtp_fc and self.quant_format.producer == MODELOPT

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        record_compile_factors()
        if not isinstance(layer, LinearBase):
            if type(layer).__name__ in ("FusedMoE", "RoutedExperts"):
                raise NotImplementedError(f"volta_nvfp4: '{prefix}' is a mixture-of-experts layer, which volta_nvfp4 "
                                          "does not serve yet")
            return None  # attention keeps an fp16 KV cache; embeddings stay unquantized
        if self._left_unquantized(prefix):
            return UnquantizedLinearMethod()
        shards = self.packed_modules_mapping.get(prefix.rpartition(".")[2])
        scheme = self.quant_format.scheme_for_fused(prefix, shards)
        if scheme.kind == NVFP4:
            from vllm_volta_fp4.plugin.quantization.nvfp4 import NvFp4LinearMethod

            return NvFp4LinearMethod(self.quant_format, scheme, prefix)
        if scheme.kind == FP8:
            from vllm_volta_fp4.plugin.quantization.fp8 import Fp8LinearMethod

            return Fp8LinearMethod(self.quant_format, scheme, prefix)
        return UnquantizedLinearMethod()


COMPILE_KEY = NAME


def record_compile_factors() -> None:
    """Put envs.compile_factors() into the vLLM config being built (its additional_config), which vLLM hashes into
    its torch.compile cache key: without them a graph compiled under other settings is loaded from the cache (seen on
    the H200: an FP8 drafter's graph handed an NVFP4 drafter's weights). Called while vLLM builds each model, before
    the first compile computes the key."""
    config = get_current_vllm_config_or_none()
    if config is not None and isinstance(config.additional_config, dict):
        config.additional_config[COMPILE_KEY] = envs.compile_factors()


_VALIDATED: set[Path] = set()
"""Model directories validated in this process (vLLM may build its config more than once)."""


def local_model_dir(model_name: str, revision: str | None = None) -> Path | None:
    """The directory holding ``model_name``: the path itself, or a hub id's snapshot already in the local cache."""
    path = Path(model_name).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_name, revision=revision, local_files_only=True))
    except Exception:  # not a hub id, or not downloaded yet: nothing local to check
        return None


def validate_before_loading(model_name: str, revision: str | None = None) -> None:
    """Validate the checkpoint once per process; raise CheckpointError (a ValueError, whose message is the one line
    vLLM's log ends with) when it cannot be served."""
    model_dir = local_model_dir(model_name, revision)
    if model_dir is None:
        logger.warning("volta_nvfp4: '%s' is not a local directory or a cached download, so it is not validated "
                       "before loading; run `volta-fp4 inspect` on it once it is downloaded", model_name)
        return
    if model_dir in _VALIDATED:
        return
    try:
        checkpoint = Checkpoint(model_dir)
        modules = checkpoint.validate()
    except CheckpointError as error:
        raise CheckpointRefused(error) from None  # no chained traceback: the message says it all
    _VALIDATED.add(model_dir)
    quantized = sum(scheme.kind != "unquantized" for scheme in modules.values())
    logger.info("volta_nvfp4: %s validated (%s %s, %d quantized layers)", model_dir, checkpoint.format.producer,
                checkpoint.format.algorithm, quantized)
    for note in checkpoint.notes:
        logger.info("volta_nvfp4: %s", note)
