#!/usr/bin/env bash
# Session 34, prepared and NOT RUN (no device was lent in session 34). It supersedes
# 2026-12-05-s33-pending-run.sh: branch s34-zsum holds s33-minp-lean's six commits and
# session 34's (the first pass's fixed-point sums a vector at a time, from a compensated y, with
# no division per element; the exact path's masses from l - lmax without one either). The code:
# bench/results/2026-12-05-s34-zsum.patch (git am on main's 0bbbc27 or later).
#
# Two runs (the carries together exceed the 64 MiB a run carries):
#  1. carry build-carry/s34/c.tar.xz: new/ (the branch's test_gpu_sample, test_gpu_virtual_ranks,
#     test_gpu_verify, libdpsampling.so*), mid/ (s33-minp-lean's libdpsampling.so*), base/
#     (main's), dps-perf. The A/B of the three libraries twice, a checked dps-perf run, the tests,
#     the virtual ranks, then the tp = 8 loop until DEADLINE (default 380 s).
#  2. carry build-carry/s34/plants.tar.xz: test_gpu_sample of three planted builds, each of which
#     must FAIL: plantA/ (s33: decide without "if (nA == a.cand) ++nA;"), plantB/ (s33's test
#     file over fed7d56's kernels: the lean maximum without the warps that have no race winner;
#     test (h) must fail), plantC/ (s34: sample_zsum.h's "if (p1) z->a1 += term" as
#     "if (p1 && !p0)"; the logprob checks must fail).
# Every binary: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
# -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON (the test binaries hold the library statically).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
C=/tmp/c; mkdir -p $C
for f in build-carry/s34/c.tar.xz build-carry/s34/plants.tar.xz; do [ -f $f ] && tar -xJf $f -C $C; done
export LD_LIBRARY_PATH=$NR/lib:/usr/local/cuda/lib64
t() { echo "[t=$((SECONDS-T0))s] $*"; }
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_kp_lp,sample_p,sample_p_lp,sample_p_flat
PERF="-t 1 -b onesided --no-peak --no-check -o $OPS -s 64x1x152064,1024x1x152064"
perf() { # tag libdir
  t "perf $1"; LD_LIBRARY_PATH=$2:$LD_LIBRARY_PATH $C/dps-perf $PERF > $OUT/perf_$1.txt 2>&1
  grep -E "sample_" $OUT/perf_$1.txt | sed "s/^/$1 /" | cut -c1-200
}
if [ -x $C/new/test_gpu_sample ]; then
  perf base $C/base; perf mid $C/mid; perf new $C/new
  perf new2 $C/new; perf mid2 $C/mid; perf base2 $C/base
  t "new, checked"
  LD_LIBRARY_PATH=$C/new:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak -o $OPS \
    -s 64x1x152064,1024x1x152064,8x1x129280 > $OUT/perf_new_checked.txt 2>&1
  grep -E "sample_|wrong" $OUT/perf_new_checked.txt | cut -c1-220
  t "test_gpu_sample"; $C/new/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
  grep -E "chi2 .*plateau min-p|isolated|passed|FAIL|fail" $OUT/sample.log | cut -c1-260
  t "vr sample"; DPS_VR_SCENARIO=sample $C/new/test_gpu_virtual_ranks > $OUT/vr_sample.log 2>&1
  echo "rc=$?"; grep -E "total|FAIL|note" $OUT/vr_sample.log | head -5
  t "verify"; $C/new/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -2 $OUT/verify.log
  t "vr all"; $C/new/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"
  grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
  n=0; f=0
  while [ $((SECONDS-T0)) -lt ${DEADLINE:-380} ]; do
    DPS_VR_TP=8 DPS_VR_BACKEND=onesided timeout 60 $C/new/test_gpu_virtual_ranks > /tmp/vr8.log 2>&1
    rc=$?; n=$((n+1)); [ $rc -ne 0 ] && { f=$((f+1)); cp /tmp/vr8.log $OUT/vr8_fail_$n.log; }
    grep -q "note:" /tmp/vr8.log && cp /tmp/vr8.log $OUT/vr8_note_$n.log
  done
  t "tp=8 onesided all scenarios: $f failed of $n runs"; ls $OUT | grep -c note || true
fi
for p in plantA plantB plantC; do
  [ -x $C/$p/test_gpu_sample ] || continue
  t "planted $p (must fail)"
  DPS_SAMPLE_CHI2_SCALE=0.3 $C/$p/test_gpu_sample onesided > $OUT/$p.log 2>&1; echo "rc=$?"
  grep -E "plateau min-p|isolated|passed|FAIL|fail|wrong|reference" $OUT/$p.log | head -6 | cut -c1-260
done
