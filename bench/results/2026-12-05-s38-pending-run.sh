#!/usr/bin/env bash
# Pending (written in session 37): one call, carry build-carry/s38/all.tar.xz (local, ignored). Binaries built on the
# CPU machine: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
# -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON (test binaries hold the library statically).
#  new38/  test_gpu_sample, test_gpu_virtual_ranks, test_gpu_verify of branch s37-flush (main
#           678cf49, then raceFlush's rejection as NaN, tested out: `4a754b6`)
#  base/, main/, flush/  libdpsampling.so of 78472ce (before s35-neginf), main (678cf49) and
#           s37-flush; dps-perf (main's). What it asks: does s37-flush take min-p back to base
#           (237 us at 1024 rows on an H100, main 243) with the -inf tests passing?
#  Rebuild (if build-carry/ is gone): the branch's patch bench/results/2026-12-05-s37-flush.patch,
#  `git am` on main; cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
#  -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON; make dpsampling test_gpu_sample
#  test_gpu_virtual_ranks test_gpu_verify (and main's, 78472ce's libdpsampling.so and dps-perf).
source "$(dirname "$0")/../device_env.sh"
C=/tmp/c38; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s38/all.tar.xz -C $C
t "test_gpu_sample (s37-flush)"; $C/new38/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
grep -E "passed \(|PASS|FAIL|differ|wrong|beyond|all -inf" $OUT/sample.log | head -16 | cut -c1-260
t "vr all"; timeout 250 $C/new38/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"
grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
t "verify"; $C/new38/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_p,sample_p_flat
n=0
for lib in base main flush flush main base; do
  [ $((SECONDS-T0)) -gt ${DEADLINE:-400} ] && { t "A/B stopped (time)"; break; }
  n=$((n+1)); f=$OUT/perf_${n}_$lib.txt
  t "perf $lib"; LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak \
    --no-check -o $OPS -s 64x1x152064,1024x1x152064 > $f 2>&1
  grep -hE "^ +sample_" $f | sed "s/^/$lib /" | cut -c1-110
done
t end
