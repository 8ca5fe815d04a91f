# Sourced by the run_*_gpu.sh scripts that run under several vLLM versions: installs the carried kit of each version
# in $VERSIONS (gpu_kit_install.sh) into ${SITE_ROOT:-/tmp}/site-VERSION and maps each version to its site in SITES.
declare -A SITES
for version in $VERSIONS; do
  SITES[$version]=${SITE_ROOT:-/tmp}/site-$version
  KIT=.gpu-kit-$version SITE=${SITES[$version]} source scripts/gpu/gpu_kit_install.sh
done
