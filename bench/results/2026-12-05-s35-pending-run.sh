#!/usr/bin/env bash
# Session 35, prepared and NOT RUN (the session's device time ran out): branch s35-neginf, the fix
# of rows whose every kept score is -inf (a negative maximum at a subnormal T: token 0 and
# logprob -inf before; the lowest index of K now), with five subnormal-T row templates in
# tests/gpu/sample_common.h and a test of distinct negative logits; and, as its own commit,
# decide() no longer loads the candidate list of temperature-only lean rows (the suspect of
# sample_t's 1.7 % loss since session 33: the A/B below shows it). The code:
# bench/results/2026-12-05-s35-neginf.patch (git am on main af279f9 or later). Session 35's run 3 (bench/results/2026-12-05-h100-s35-final.txt) is
# the negative control: main's kernels under the first of those templates failed
# test_gpu_sample (2 of 257 rows, both backends) and the virtual ranks (25 failures).
#
# Two calls (the carries together exceed 64 MiB):
#  1. `bash <this> main`, carry build-carry/s35n/c.tar.xz: new/ (the branch's test_gpu_sample,
#     test_gpu_virtual_ranks, test_gpu_verify, libdpsampling.so*), base/ (main's
#     libdpsampling.so*), dps-perf: the tests, then an A/B of the two libraries.
#  2. `bash <this> plants`, carry build-carry/s35n/plants.tar.xz: test_gpu_sample of the branch
#     with one half of the fix undone, each of which must FAIL: plantA/ (raceFlush drops -inf
#     keys again), plantB/ (decide does not skip top-p for a -inf largest score).
# Every binary: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
# -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON (the test binaries hold the library statically).
# Each call extracts into a directory of its own: a warm machine keeps the last call's /tmp.
source "$(dirname "$0")/../device_env.sh"
if [ "${1:-main}" = plants ]; then
  C=/tmp/c35p; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s35n/plants.tar.xz -C $C
  for p in plantA plantB; do
    t "planted $p (must fail)"; $C/$p/test_gpu_sample onesided > $OUT/$p.log 2>&1; echo "rc=$?"
    grep -E "passed \(|FAIL|differ|wrong" $OUT/$p.log | head -4 | cut -c1-260
  done
  exit 0
fi
C=/tmp/c35n; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s35n/c.tar.xz -C $C
t "test_gpu_sample"; $C/new/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
grep -E "passed \(|FAIL|fail|differ|wrong" $OUT/sample.log | head -12 | cut -c1-260
t "vr all"; timeout 200 $C/new/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"
grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
t "verify"; $C/new/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_p,sample_p_flat
n=0
for lib in base new new base; do
  n=$((n+1)); f=$OUT/perf_${n}_$lib.txt
  t "perf $lib"; LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak \
    --no-check -o $OPS -s 64x1x152064,1024x1x152064 > $f 2>&1
  grep -hE "^ +sample_" $f | sed "s/^/$lib /" | cut -c1-110
done
t end
