#!/usr/bin/env bash
# The ping-pong consumers (GroupedGemmOptions::hopper_pingpong, opt-in;
# docs/BENCHMARKS.md, thirteenth round): their tests, then how they time
# against the default cooperative consumers on the rows they are for. About
# two minutes on an H100/H200:
#
#   tests/gpu/pingpong_check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds grouped_gemm_test and gemm-bench (and a lib/ beside it when
# the shared libraries travel with them). Steps: GroupedGemmTest.Ping*
# (stop here if it fails: the timings would mean nothing); the grouped
# batches and bf16 2048^3 / 4096^3 in two alternating rounds, --pingpong=1
# against the default (ab_kernels.sh, back-to-back); one run of the same
# rows with --tile_n=128 and without ping-pong, so that the ping-pong rows
# can be read against the cooperative kernel at the same tile width too;
# last, GroupedGemmTest.PingPongTurnsOnASmallBatch under compute-sanitizer's
# racecheck and synccheck (the turns' mbarriers and the shared ring).
set -uo pipefail
bin=$1 out=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_step.sh"
gpu_setup "$bin" "$out"
run pingpong_test 200 "$bin/grouped_gemm_test" --gtest_filter='*PingPong*' --gtest_brief=1
grep -hE 'Failure|Expected|Which is|moved' "$out"/pingpong_test.log | head -20
if ! grep -q 'PASSED.*2 tests' "$out/pingpong_test.log"; then
  printf '%s\n' "${summary[@]}"
  echo "ping-pong test did not pass: no timings"
  exit 1
fi
rows=(--quick --dtype=bfloat16 --size=2048^3 --size=4096^3 --size=256 --size=1024)
NEW_FLAGS=--pingpong=1 BASE_FLAGS= timeout 300 bash "$here/ab_kernels.sh" \
    "$bin/gemm-bench" "$bin/gemm-bench" "$out/ab" 2 "${rows[@]}" >"$out/ab.txt" 2>&1
summary+=("ab_kernels (new = --pingpong=1): $(grep -c '^round' "$out/ab.txt") runs")
run narrow 90 "$bin/gemm-bench" "${rows[@]}" --tile_n=128 --timing=back-to-back \
    --json="$out/narrow.json"
tail -n 14 "$out/ab.txt"
echo "== cooperative at --tile_n=128, back-to-back"
grep -E 'ours persistent|cuBLAS|cublasGemmGrouped' "$out/narrow.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
summary_pattern='ERROR SUMMARY|PASSED|FAILED'
run pingpong_racecheck 150 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 99 --print-limit 20 "$bin/grouped_gemm_test" --gtest_brief=1 \
    --gtest_filter='*PingPongTurnsOnASmallBatch*'
run pingpong_synccheck 100 "$sanitizer" --tool synccheck --error-exitcode 99 --print-limit 20 \
    "$bin/grouped_gemm_test" --gtest_brief=1 --gtest_filter='*PingPongTurnsOnASmallBatch*'
printf '%s\n' "${summary[@]}"
