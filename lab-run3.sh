#!/bin/bash
# device call 3: follow-up 1 (4-stage ring, one-wave plan): tests, bench, ncu source profile
set -u
export SPARSEMLA_GPU_TEST_FILTER='GpuIndexer*'
scripts/gpu-check --out $OUT/gc --no-bench --no-python --no-serve-sim --no-sanitizer > $OUT/gc.log 2>&1; echo "gc rc=$?"
sed -n '/gpu-check summary/,$p' $OUT/gc.log | head -14
grep -E "^\[  (FAILED|PASSED) " $OUT/gc/gpu-tests.log | head -20
CLI=build-gpu/tools/sparsemla
timeout 150 $CLI bench --op indexer --paths cuda-sm90 --contexts 8192,131072,1048576 --batches 1,32,128 --topks 512 --verify-rows 2 --reps 30 --warmup 3 --json $OUT/bench.json > $OUT/bench.txt 2>&1; echo "bench rc=$?"; grep -E "uniform" $OUT/bench.txt
SPARSEMLA_INDEXER_SM90_ONE_WAVE_FROM=1 timeout 60 $CLI bench --op indexer --paths cuda-sm90 --contexts 131072,1048576 --batches 1 --topks 512 --verify-rows 1 --reps 30 --warmup 3 > $OUT/bench_b1_onewave.txt 2>&1; echo "bench onewave rc=$?"; grep -E "uniform" $OUT/bench_b1_onewave.txt
for cb in 1048576:1 1048576:32; do c=${cb%%:*}; b=${cb##*:}
timeout 100 ncu --clock-control none -k regex:indexer --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats $CLI bench --op indexer --paths cuda-sm90 --contexts $c --batches $b --topks 512 --no-graph --warmup 0 --reps 1 --verify-max-batch 0 > $OUT/ncu_$b.txt 2>&1; echo "ncu $cb rc=$?"
grep -E "indexer_|Duration|Achieved Occupancy|DRAM Throughput|Issued Warp|Warp Cycles Per Issued|Grid Size" $OUT/ncu_$b.txt
done
timeout 150 ncu --clock-control none --set full --import-source yes -k regex:indexer_sm90_score --launch-count 1 -f -o $OUT/score $CLI bench --op indexer --paths cuda-sm90 --contexts 1048576 --batches 32 --topks 512 --no-graph --warmup 0 --reps 1 --verify-max-batch 0 > $OUT/score.log 2>&1; echo "ncu full rc=$?"
ncu -i $OUT/score.ncu-rep --page source --csv --print-source sass > $OUT/source.csv 2>/dev/null
python3 scripts/ncu-stalls $OUT/source.csv --top 30 > $OUT/stalls.txt 2>&1; head -40 $OUT/stalls.txt
rm -f $OUT/score.ncu-rep
