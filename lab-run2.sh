#!/bin/bash
# device call: lean sm90 indexer loop: tests, sanitizers on the exact-data test, bench at 2 and 3 items/SM
set -u
export SPARSEMLA_GPU_TEST_FILTER='GpuIndexer*'
export SPARSEMLA_MEMCHECK_FILTER='GpuIndexerSm90.ExactData*:GpuIndexerSm90.TiesLong*'
export SPARSEMLA_RACECHECK_FILTER='GpuIndexerSm90.ExactData*'
export SPARSEMLA_INITCHECK_FILTER='GpuIndexerSm90.ExactData*'
export SPARSEMLA_SANITIZER_TOOLS='memcheck racecheck'
scripts/gpu-check --out $OUT/gc --no-bench --no-python --no-serve-sim > $OUT/gc.log 2>&1; echo "gc rc=$?"
tail -22 $OUT/gc.log
grep -E "^\[  (FAILED|PASSED) |FAILED  \]" $OUT/gc/gpu-tests.log | head -20
CLI=build-gpu/tools/sparsemla
for ips in 2 3; do
SPARSEMLA_INDEXER_SM90_ITEMS_PER_SM=$ips timeout 200 $CLI bench --op indexer --paths cuda-sm90 --contexts 8192,131072,1048576 --batches 1,32,128 --topks 512 --verify-rows 2 --reps 30 --warmup 3 --json $OUT/bench_ips$ips.json > $OUT/bench_ips$ips.txt 2>&1; echo "bench ips=$ips rc=$?"; grep -E "uniform" $OUT/bench_ips$ips.txt
done
timeout 100 ncu --clock-control none -k regex:indexer --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats $CLI bench --op indexer --paths cuda-sm90 --contexts 1048576 --batches 32 --topks 512 --no-graph --warmup 0 --reps 1 --verify-max-batch 0 > $OUT/ncu_1m_32.txt 2>&1; echo "ncu rc=$?"
grep -E "indexer_|Duration|Achieved Occupancy|DRAM Throughput|Issued Warp|Warp Cycles Per Issued|Grid Size" $OUT/ncu_1m_32.txt
