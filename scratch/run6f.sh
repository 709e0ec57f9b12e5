#!/usr/bin/env bash
# PDL placement experiment + the full virtual-rank matrix at tp 6..8
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
# alt: no explicit launch_dependents in the local passes (the dependents launch as the blocks exit)
rm -rf /tmp/alt && mkdir /tmp/alt && tar --exclude="./build*" -cf - . | tar -C /tmp/alt -xf -
sed -i '/dpsPdlRelease(); \/\* the merge may be scheduled/d' /tmp/alt/src/kernels/select.cu
grep -c dpsPdlRelease /tmp/alt/src/kernels/select.cu
NCCL_ROOT=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
(cd /tmp/alt && cmake -S . -B b -DCMAKE_BUILD_TYPE=Release -DDPS_BUILD_PYTHON=OFF -DDPS_NCCL_ROOT=$NCCL_ROOT > $OUT/alt-build.log 2>&1 && cmake --build b -j 16 --target dps-perf >> $OUT/alt-build.log 2>&1) || { echo "alt build failed"; tail -20 $OUT/alt-build.log; }
echo "builds done at $((SECONDS-T0)) s"
SH=8x1x64640,64x1x76032,128x1x76032,256x1x76032,512x1x76032,1024x1x76032
row() { grep -E "^ +(argmax|topk) " | awk '{print $1, $3, $8}' | paste -sd' '; }
echo "onesided pdl=1: $(timeout 60 $B/tools/dps-perf -t 1 -b onesided -o argmax,topk -s $SH -r 20 2>&1 | row)"
echo "onesided pdl=0: $(DPSAMPLING_PDL=0 timeout 60 $B/tools/dps-perf -t 1 -b onesided -o argmax,topk -s $SH -r 20 2>&1 | row)"
echo "nccl:           $(timeout 60 $B/tools/dps-perf -t 1 -b nccl -o argmax,topk -s $SH -r 20 2>&1 | row)"
[ -x /tmp/alt/b/tools/dps-perf ] && echo "alt pdl=1:      $(timeout 60 /tmp/alt/b/tools/dps-perf -t 1 -b onesided -o argmax,topk -s $SH -r 20 2>&1 | row)"
echo "at $((SECONDS-T0)) s"
DPS_VR_FULL=1 timeout 240 $B/tests/test_gpu_virtual_ranks tp=6,7,8 > $OUT/vr-full-678.log 2>&1; echo "vr full tp6-8 rc=$?"; grep -E "^tp=|total" $OUT/vr-full-678.log
echo "total $((SECONDS-T0)) s"
