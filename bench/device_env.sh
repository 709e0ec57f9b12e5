# Sourced by the device-run scripts in bench/results (bash): torch's NCCL on the device machine,
# NVLink multicast off (not usable there, ../shared/device.md), t() to stamp the seconds since the
# start, and the card's name in the output.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
export LD_LIBRARY_PATH=$NR/lib:/usr/local/cuda/lib64
t() { echo "[t=$((SECONDS-T0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
