#!/usr/bin/env bash
# Session 38, call 2 of 2, on call 1's warm machine (its build/ kept): ctest 24..44, the Python
# tests, then #23's figures with the HBM read peak of the same run and torch in the same call.
source "$(dirname "$0")/../device_env.sh"
t "ctest 24..44"; timeout 330 ctest --test-dir build -I 24,44 --output-on-failure > $OUT/ctest2.log 2>&1
echo "rc=$?"; grep -E "Test +#|tests passed|Total Test" $OUT/ctest2.log | cut -c1-100
t "make test-python"; timeout 150 make test-python CMAKE_ARGS="-DDPS_NCCL_ROOT=$NR -DCMAKE_CUDA_ARCHITECTURES=90" > $OUT/pytest.log 2>&1
echo "rc=$?"; tail -1 $OUT/pytest.log
t "dps-perf with the read peak"; timeout 120 build/tools/dps-perf -t 1 -b onesided \
  -o argmax,argmax_lse,sample_topk50,sample_t,sample_kp,sample_p,sample_p_flat,sample_minp \
  -s 64x1x76032,1024x1x76032,64x1x152064,1024x1x152064 > $OUT/targets.txt 2>&1
echo "rc=$?"; grep -E "peak|^ +(argmax|sample_)" $OUT/targets.txt | cut -c1-130
t "compare_torch sample"; PYTHONPATH=build/python timeout 200 python3 bench/compare_torch.py --world 1 \
  --ops sample --backends onesided --sample-shapes 64x152064,1024x152064 --sample-cases t,kp,p,p_flat,minp \
  > $OUT/torch.txt 2>&1
echo "rc=$?"; tail -25 $OUT/torch.txt | cut -c1-160
t end
