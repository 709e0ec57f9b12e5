#!/usr/bin/env bash
# Session 38, call 3: is s38-flush's sample_t at 64 rows slower than main's (call 1: 22.16 against
# 21.41 us, two figures each)? Carry build-carry/s38/libs3.tar.xz (local, ignored): base/ (78472ce),
# main/ (9f929b9), flush/ (e2ad131 = main + 34239c2 + the binding's view cache) libdpsampling.so and
# main's dps-perf, all built on the CPU machine (Release, sm_90, DPS_BUILD_PYTHON=OFF, DPS_WERROR=ON).
source "$(dirname "$0")/../device_env.sh"
C=/tmp/c38; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s38/libs3.tar.xz -C $C
n=0
for r in 1 2 3 4; do for lib in base main flush; do
  [ $((SECONDS-T0)) -gt ${DEADLINE:-240} ] && break 2
  n=$((n+1)); echo "## ${n}_$lib" >> $OUT/ab3.txt
  LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/main/dps-perf -t 1 -b onesided --no-peak --no-check \
    -o sample_t,sample_minp -s 8x1x152064,64x1x152064,1024x1x152064 >> $OUT/ab3.txt 2>&1
done; done
grep -E "^## |^ +sample_" $OUT/ab3.txt | cut -c1-100
t end
