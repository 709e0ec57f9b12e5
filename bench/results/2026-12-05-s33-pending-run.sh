#!/usr/bin/env bash
# Session 33 run B, prepared and NOT RUN (no device was lent after run A): min-p rows on the lean
# pass (+ the chi-square cases), and the virtual ranks' stream rendezvous. The code: branch
# s33-minp-lean (= bench/results/2026-12-05-s33-minp-lean.patch on 0bbbc27). Carry a
# build-carry/s33/c.tar.xz of: new/ (test_gpu_sample, test_gpu_virtual_ranks, test_gpu_verify and
# libdpsampling.so* of the branch), dps-perf, base/ (main's libdpsampling.so*), plant/
# (test_gpu_sample of the branch with decide's "if (nA == a.cand) ++nA;" removed), plantB/
# (test_gpu_sample of the branch's test file over fed7d56's kernels: the lean maximum that
# dropped warps without a race winner; test (h) must fail). new/ and base/ 52 MB as xz:
# plantB in build-carry/s33/c2.tar.xz (8.8 MB): with c.tar.xz over the 64 MiB carry, so a run of
# its own (carry c2 alone: the steps whose binaries are absent fail fast and the rest runs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
C=/tmp/c; mkdir -p $C
for f in build-carry/s33/c.tar.xz build-carry/s33/c2.tar.xz; do [ -f $f ] && tar -xJf $f -C $C; done
export LD_LIBRARY_PATH=$NR/lib:/usr/local/cuda/lib64
t() { echo "[t=$((SECONDS-T0))s] $*"; }
PERF="-t 1 -b onesided --no-peak --no-check -o sample_t,sample_minp,sample_kp,sample_p -s 64x1x152064,1024x1x152064"
perf() { # tag libdir extra
  t "perf $1"; LD_LIBRARY_PATH=$2:$LD_LIBRARY_PATH $C/dps-perf $PERF $3 > $OUT/perf_$1.txt 2>&1
  grep -E "sample_" $OUT/perf_$1.txt | sed "s/^/$1 /" | cut -c1-200
}
perf base $C/base; perf new $C/new
t "new, checked"; LD_LIBRARY_PATH=$C/new:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak -o sample_minp,sample_t -s 64x1x152064,1024x1x152064,8x1x129280 > $OUT/perf_new_checked.txt 2>&1
grep -E "sample_|wrong" $OUT/perf_new_checked.txt | cut -c1-220
perf new2 $C/new; perf base2 $C/base
t "test_gpu_sample"; $C/new/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"; grep -E "chi2 .*plateau min-p|passed|FAIL|fail" $OUT/sample.log | cut -c1-260
t "planted (nA not past a full list)"; DPS_SAMPLE_CHI2_SCALE=0.3 $C/plant/test_gpu_sample onesided > $OUT/plant.log 2>&1; echo "rc=$?"; grep -E "plateau min-p|passed|FAIL|fail|wrong|reference" $OUT/plant.log | head -8 | cut -c1-260
if [ -x $C/plantB/test_gpu_sample ]; then
  t "planted B (fed7d56: the lean maximum without the warps that have no winner)"; DPS_SAMPLE_CHI2_SCALE=0.3 $C/plantB/test_gpu_sample onesided > $OUT/plantB.log 2>&1; echo "rc=$?"; grep -E "isolated|passed|FAIL" $OUT/plantB.log | head -6 | cut -c1-260
fi
t "vr sample"; DPS_VR_SCENARIO=sample $C/new/test_gpu_virtual_ranks > $OUT/vr_sample.log 2>&1; echo "rc=$?"; grep -E "total|FAIL|note" $OUT/vr_sample.log | head -5
t "verify"; $C/new/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -2 $OUT/verify.log
t "vr all"; $C/new/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"; grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
n=0; f=0
while [ $((SECONDS-T0)) -lt ${DEADLINE:-380} ]; do
  DPS_VR_TP=8 DPS_VR_BACKEND=onesided timeout 60 $C/new/test_gpu_virtual_ranks > /tmp/vr8.log 2>&1; rc=$?
  n=$((n+1)); [ $rc -ne 0 ] && { f=$((f+1)); cp /tmp/vr8.log $OUT/vr8_fail_$n.log; }
  grep -q "note:" /tmp/vr8.log && cp /tmp/vr8.log $OUT/vr8_note_$n.log
done
t "tp=8 onesided all scenarios: $f failed of $n runs"; ls $OUT | grep -c note || true
