#!/bin/bash
# one device call: build, indexer GPU tests, bench baseline, ncu of the indexer kernels
set -u
export SPARSEMLA_GPU_TEST_FILTER='GpuIndexerSm90*'
scripts/gpu-check --out $OUT/gc --no-bench --no-python --no-sanitizer --no-serve-sim > $OUT/gc.log 2>&1; echo "gc rc=$?"
tail -25 $OUT/gc.log
CLI=build-gpu/tools/sparsemla
timeout 150 $CLI bench --op indexer --paths cuda-sm90 --contexts 8192,1048576 --batches 1,32 --topks 512 --verify-rows 1 --reps 30 --warmup 3 > $OUT/bench.txt 2>&1; echo "bench rc=$?"; cat $OUT/bench.txt | tail -15
for cb in 8192:1 1048576:1 1048576:32; do c=${cb%%:*}; b=${cb##*:}
 timeout 100 ncu --clock-control none -k regex:indexer --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis $CLI bench --op indexer --paths cuda-sm90 --contexts $c --batches $b --topks 512 --no-graph --warmup 0 --reps 1 --verify-max-batch 0 > $OUT/ncu_${c}_${b}.txt 2>&1; echo "ncu $cb rc=$?"
 grep -E "indexer_|Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|Issued Warp|Grid Size|Shared Memory Config|Dynamic Shared" $OUT/ncu_${c}_${b}.txt | head -60
done
timeout 200 ncu --clock-control none --set full --import-source yes -k regex:indexer_sm90_score --launch-count 1 -f -o $OUT/score $CLI bench --op indexer --paths cuda-sm90 --contexts 1048576 --batches 32 --topks 512 --no-graph --warmup 0 --reps 1 --verify-max-batch 0 > $OUT/score.log 2>&1; echo "ncu full rc=$?"
ncu -i $OUT/score.ncu-rep --page source --csv --print-source sass > $OUT/source.csv 2>/dev/null
python3 scripts/ncu-stalls $OUT/source.csv --top 25 > $OUT/stalls.txt 2>&1; head -80 $OUT/stalls.txt
ncu -i $OUT/score.ncu-rep --page details > $OUT/score_details.txt 2>&1
rm -f $OUT/score.ncu-rep
