#!/usr/bin/env bash
# Runs the kernel and engine tests under NVIDIA compute-sanitizer on a
# machine with an NVIDIA GPU: memcheck (with leak check), racecheck (shared
# memory hazards), synccheck (barrier misuse) and initcheck (reads of
# uninitialised device memory). The sanitizers slow kernels down by 10-100x,
# so the large-size tests are filtered out; every kernel family, dtype,
# transpose, odd shape, unaligned path and grouped batch still runs.
#
#   tests/gpu/sanitize_kernels.sh BIN_DIR OUT_DIR
#
# Exit status: 0 when every run is clean. A summary table is printed last.
set -uo pipefail
bin=$1 out=$2
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[[ -x $sanitizer ]] || { echo "sanitize_kernels: compute-sanitizer not found" >&2; exit 1; }
"$sanitizer" --version | tail -1
# The launcher zeroes the tensor-map slots of table batches only under tools
# (grouped_gemm.cc, ZeroMapSlots: initcheck takes the kernel's tensormap
# publish for a read of its destination): this asks for it outright
# (it also zeroes them where CUDA_INJECTION64_PATH is set; whether
# compute-sanitizer sets that has not been checked).
export MATMUL_ZERO_MAP_SLOTS=1
kernel_filter='GroupedGemmTest.OddShapesTransposesAndScalars:GroupedGemmTest.OutputTypes:GroupedGemmTest.UnalignedRowsTakeTheSimtPath:GroupedGemmTest.AllFamiliesAgree:GroupedGemmTest.GroupedBatchesOfManySizes:GroupedGemmTest.EdgeTilesAtEveryNarrowerWidth:GroupedGemmTest.SimtWideTiles:GroupedGemmTest.PingPongTurnsOnASmallBatch:GroupedGemmTest.Tf32EveryStoredLayoutBothWays:GroupedGemmTest.Tf32CopiesOfABatchTakeFewLaunches:GroupedGemmTest.Tf32RegisterPathLargeAndOdd'
engine_filter='CudaEngineTest.DescribesTheDevice:CudaEngineTest.MixedBatchOfEveryDTypeOddShapesAndTransposes:CudaEngineTest.BatchLargerThanHalfThePoolIsSplitAndStillCorrect'
summary=()
failed=0
run() {  # name, timeout, tool flags..., --, command...
  local name=$1 limit=$2; shift 2
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  local start=$SECONDS
  timeout "$limit" "$sanitizer" "${flags[@]}" --error-exitcode 99 --print-limit 20 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local errors
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ errors?' "$out/$name.log" | tail -1)
  local tests
  tests=$(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.log" | tr '\n' ' ')
  [[ $rc -eq 0 ]] || failed=1
  summary+=("$(printf '%-28s rc=%-3s %4ss  %-26s %s' "$name" "$rc" "$((SECONDS - start))" "${errors:-no summary}" "$tests")")
}
run memcheck_kernels 200 --tool memcheck --leak-check full -- \
    "$bin/grouped_gemm_test" --gtest_brief=1 --gtest_filter="$kernel_filter"
run memcheck_engine 80 --tool memcheck --leak-check full -- \
    "$bin/cuda_engine_test" --gtest_brief=1 --gtest_filter="$engine_filter"
run racecheck_kernels 150 --tool racecheck --racecheck-report hazard -- \
    "$bin/grouped_gemm_test" --gtest_brief=1 \
    --gtest_filter='GroupedGemmTest.OutputTypes:GroupedGemmTest.UnalignedRowsTakeTheSimtPath:GroupedGemmTest.OddShapesTransposesAndScalars:GroupedGemmTest.SimtWideTiles:GroupedGemmTest.Tf32CopiesOfABatchTakeFewLaunches'
run synccheck_kernels 60 --tool synccheck -- \
    "$bin/grouped_gemm_test" --gtest_brief=1 \
    --gtest_filter='GroupedGemmTest.OutputTypes:GroupedGemmTest.OddShapesTransposesAndScalars'
run initcheck_kernels 60 --tool initcheck -- \
    "$bin/grouped_gemm_test" --gtest_brief=1 \
    --gtest_filter='GroupedGemmTest.OutputTypes:GroupedGemmTest.UnalignedRowsTakeTheSimtPath:GroupedGemmTest.Tf32EveryStoredLayoutBothWays'
for f in "$out"/*.log; do
  grep -m 12 -E '========= (Invalid|Race|Barrier|Uninitialized|Leaked|Error|Program hit|Malformed|Warning)' "$f" \
      | sed "s|^|$(basename "$f" .log): |"
done
printf '%s\n' "${summary[@]}"
exit "$failed"
