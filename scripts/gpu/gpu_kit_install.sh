# Sourced by the run_*_gpu.sh scripts: installs a carried kit (vLLM's pure-Python part, the wheels the GPU machine
# lacks, stubs for vLLM's compiled modules) into $SITE, default /tmp/site-VERSION. Make the kit here first:
#   bash scripts/gpu/make_gpu_kit.sh 0.20.2      (then carry [".gpu-kit-0.20.2", ".gpu-kit-wheels"] in the device call)
# Usage: KIT=.gpu-kit-0.20.2 source scripts/gpu/gpu_kit_install.sh
KIT=${KIT:-.gpu-kit-0.20.2}
SITE=${SITE:-/tmp/site-${KIT#.gpu-kit-}}
rm -rf "$SITE" && mkdir -p "$SITE"
{ python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $(sed 's|^|.gpu-kit-wheels/|' "$KIT/wheels.txt") &&
  tar xzf "$KIT"/vllm-py.tgz -C "$SITE" && python3 "$KIT"/patch_vllm.py "$SITE"; } > "$OUT/kit-install-${KIT#.gpu-kit-}.log" 2>&1 \
  || { tail -20 "$OUT/kit-install-${KIT#.gpu-kit-}.log"; exit 1; }
# The plugin's entry points (as pip would install them) beside the kit, so that processes vLLM starts itself —
# tensor-parallel workers, the platform plugin check, `vllm serve` — load it; the code itself comes from this
# checkout on PYTHONPATH.
python3 - "$SITE" <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path(sys.argv[1]) / f"vllm_volta_fp4-{project['version']}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-volta-fp4\nVersion: {project['version']}\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
    for group, points in project["entry-points"].items()))
PY
