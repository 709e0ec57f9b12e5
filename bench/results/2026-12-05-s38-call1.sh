#!/usr/bin/env bash
# Session 38, call 1 of 2 (one warm machine). Tree: branch s38-flush (main 9f929b9 + the raceFlush
# change of bench/results/2026-12-05-s37-flush.patch). Carry build-carry/s38/libs.tar.xz (local,
# ignored): base/ (78472ce) and main/ (9f929b9) libdpsampling.so and main's dps-perf, built on the CPU
# machine with cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_BUILD_PYTHON=OFF
# -DDPS_WERROR=ON. The README's build of the tree, A/B base/main/flush, then ctest 1..26.
source "$(dirname "$0")/../device_env.sh"
t "make build"; make build CMAKE_ARGS="-DDPS_NCCL_ROOT=$NR -DCMAKE_CUDA_ARCHITECTURES=90" > $OUT/build.log 2>&1
echo "rc=$?"; tail -2 $OUT/build.log
C=/tmp/c38; rm -rf $C; mkdir -p $C/flush; tar -xJf build-carry/s38/libs.tar.xz -C $C; cp -a build/libdpsampling.so* $C/flush/
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_p,sample_p_flat
n=0
for lib in base main flush flush main base; do
  n=$((n+1)); t "perf $n $lib"; echo "## ${n}_$lib" >> $OUT/ab.txt
  LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/main/dps-perf -t 1 -b onesided --no-peak \
    --no-check -o $OPS -s 64x1x152064,1024x1x152064 >> $OUT/ab.txt 2>&1
done
grep -E "^## |library loaded|^ +sample_" $OUT/ab.txt | cut -c1-100
left=$((570 - (SECONDS-T0)))
t "ctest 1..26 (limit ${left}s)"; timeout $left ctest --test-dir build -I 1,26 --output-on-failure > $OUT/ctest1.log 2>&1
echo "rc=$?"; grep -E "Test +#|tests passed|Total Test" $OUT/ctest1.log | cut -c1-100
t end
