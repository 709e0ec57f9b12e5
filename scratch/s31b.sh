#!/usr/bin/env bash
# Next device session, run B: A/B of the sampling cases over four libraries (base a7ad91a, s30 = session 30's
# patch, s31 = branch s31-fine-round, s31v4 = the same with SEARCH_VECS = 4), twice, interleaved.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
CU=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
mkdir -p /tmp/f && tar -xJf build-carry/r3/perf.tar.xz -C /tmp/f
L=$NR/lib:$CU
P="-t 1 -b onesided --no-peak --no-check -o sample_topk50,sample_t,sample_kp,sample_p,sample_p_flat,sample_minp -s 64x1x152064,1024x1x152064"
for v in base s30 s31 s31v4 base s30 s31 s31v4; do
  LD_LIBRARY_PATH=/tmp/f/$v:$L timeout 100 /tmp/f/dps-perf $P > /tmp/p.txt 2>&1; echo "== $v exit $? [t=$((SECONDS-T0))s]"
  grep -E "^ *sample_" /tmp/p.txt | awk '{print $1,$3,$8}' | paste - - - - - - - - - - - -; sed "s/^/$v /" /tmp/p.txt >> $OUT/ab.txt
done
echo "stamps of the split exact rows (s31stamp: s31 with stamp-s31.diff; STAMP lines: 10 ns units per phase)"
for c in "sample_p 64x1x152064" "sample_p_flat 8x1x152064" "sample_p 16x1x152064"; do
  set -- $c
  LD_LIBRARY_PATH=/tmp/f/s31stamp:$L timeout 60 /tmp/f/dps-perf -t 1 -b onesided --no-peak --no-check -o $1 -s $2 > $OUT/stamp_$1_$2.txt 2>&1; echo "stamp $1 $2 exit $? [t=$((SECONDS-T0))s]"; grep -E "^ *sample_p" $OUT/stamp_$1_$2.txt | head -2; grep -c STAMP $OUT/stamp_$1_$2.txt
done
for f in $OUT/stamp_*.txt; do echo "== $f"; python3 scratch/stamps31.py $f; done 2>&1 | tee $OUT/stamps_summary.txt
echo "[t=$((SECONDS-T0))s] end"
