#!/usr/bin/env bash
# Runs the GPU part of the suite on a machine with an NVIDIA GPU, from built
# binaries: the kernel and engine tests, then the kernel benchmark and the
# engine's small-batch latency (engine-bench).
#
#   tests/gpu/run_suite.sh BIN_DIR OUT_DIR [quick|full]
#
# BIN_DIR holds grouped_gemm_test, cuda_engine_test, gemm-bench and
# engine-bench (and a lib/ beside them when the shared libraries travel with
# them). Logs and the benchmarks' JSON go to OUT_DIR; a summary table is
# printed last.
set -uo pipefail
bin=$1 out=$2 mode=${3:-full}
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv | tee "$out/gpu.txt"
summary_pattern='PASSED|FAILED|tests ran'
source "$(dirname "${BASH_SOURCE[0]}")/run_step.sh"
run grouped_gemm_test 420 "$bin/grouped_gemm_test" --gtest_brief=1
run cuda_engine_test 240 "$bin/cuda_engine_test" --gtest_brief=1
if [[ $mode == quick ]]; then
  run gemm_bench 240 "$bin/gemm-bench" --quick --json="$out/gemm_bench.json"
else
  run gemm_bench 540 "$bin/gemm-bench" --json="$out/gemm_bench.json"
fi
run engine_bench 120 "$bin/engine-bench" --json="$out/engine_bench.json"
grep -hE 'Failure|error:|Expected|Which is|LE\(|problem [0-9]+' "$out"/grouped_gemm_test.log "$out"/cuda_engine_test.log | head -40
cat "$out/gemm_bench.log" | tail -60
grep -A12 '^dtype' "$out/engine_bench.log"
printf '%s\n' "${summary[@]}"
