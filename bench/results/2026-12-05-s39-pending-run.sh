#!/usr/bin/env bash
# Pending (written in session 38, no device time left; session 39 had no device): the Python drop-in
# changes of sessions 38 and 39 (d065e78, 900fedf, 07869cd, dc1baf5; c0ff2eb, c31c0af, 0967637,
# cafcb77, ee825cf, 403c82b) on a GPU, first the tests written for them, then the Python suite, then
# the C tests as far as the time goes (a second call on the same warm machine: ctest -I <next>,44).
# The README's build on the device; no carry. On one GPU the tp = 1 cases run (test_select's drop-in,
# engine_calls at tp = 1, the view cache); the lazy-dtype and threads checks and engine_calls at
# tp >= 2 need two GPUs: run this again with kind nvidia-h100-x2 / nvidia-h200-x2 when one is lent.
source "$(dirname "$0")/../device_env.sh"
t "make build"; make build CMAKE_ARGS="-DDPS_NCCL_ROOT=$NR -DCMAKE_CUDA_ARCHITECTURES=90" > $OUT/build.log 2>&1
echo "rc=$?"; tail -1 $OUT/build.log
t "the new GPU tests"; PYTHONPATH=build/python timeout 300 python3 -m pytest -v -rs python/tests \
  -k "engine_calls or drop_in or view_cache or persistent_outputs or lazy or threads" > $OUT/pytest_new.log 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|SKIPPED|ERROR" $OUT/pytest_new.log | cut -c1-160 | head -30
t "make test-python"; timeout 200 make test-python CMAKE_ARGS="-DDPS_NCCL_ROOT=$NR -DCMAKE_CUDA_ARCHITECTURES=90" > $OUT/pytest.log 2>&1
echo "rc=$?"; tail -1 $OUT/pytest.log
left=$((570 - (SECONDS-T0)))
t "ctest (limit ${left}s)"; timeout $left ctest --test-dir build --output-on-failure > $OUT/ctest.log 2>&1
echo "rc=$?"; grep -E "Test +#|tests passed|Total Test" $OUT/ctest.log | cut -c1-100
t end
