#!/usr/bin/env bash
# The GPU run that turned GroupedGemmOptions::hopper_edge_tiles on by
# default (docs/BENCHMARKS.md, ninth and tenth rounds); run it again after a
# change to the edge-tile paths. Two phases of under ten minutes each, on a
# machine with an NVIDIA GPU:
#
#   tests/gpu/edge_tiles_check.sh BIN_DIR OUT_DIR tests
#       grouped_gemm_test (EdgeTilesAtEveryNarrowerWidth and
#       TmaStoresStayInsideTheMatrix run the option), cuda_engine_test, and
#       compute-sanitizer memcheck on the edge-tile tests.
#   tests/gpu/edge_tiles_check.sh BIN_DIR OUT_DIR bench
#       the same gemm-bench with --edge_tiles=0 and =1: two alternating
#       rounds back to back (tests/gpu/ab_kernels.sh) on the grouped batches
#       and single problems with and without edge tiles, then one isolated
#       run of the grouped batches each way; with BIN_DIR/libprofiler.so.0
#       present, also a host profile of the launcher on the 1024-problem
#       batch (CPUPROFILE; read it with google-pprof and gemm-bench).
#
# BIN_DIR holds grouped_gemm_test, cuda_engine_test and gemm-bench (and a
# lib/ beside it when the shared libraries travel with them). OUT_DIR gets
# many files: pack it into one before fetching it from a lent machine.
set -uo pipefail
bin=$1 out=$2 phase=$3
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version,temperature.gpu --format=csv \
    >"$out/gpu_$phase.txt" 2>&1
summary_pattern='^\[  (PASSED|FAILED) |ERROR SUMMARY'
source "$here/run_step.sh"
case "$phase" in
  tests)
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    run grouped_gemm_test 330 "$bin/grouped_gemm_test" --gtest_brief=1
    run cuda_engine_test 120 "$bin/cuda_engine_test" --gtest_brief=1
    run memcheck_edges 110 "$sanitizer" --tool memcheck --error-exitcode 99 \
        "$bin/grouped_gemm_test" --gtest_brief=1 \
        --gtest_filter='GroupedGemmTest.EdgeTilesAtEveryNarrowerWidth:GroupedGemmTest.TmaStoresStayInsideTheMatrix'
    grep -hE 'Failure|Expected|Which is|problem [0-9]+:|========= (Invalid|Error)' "$out"/*.log | head -30
    ;;
  bench)
    NEW_FLAGS=--edge_tiles=1 BASE_FLAGS=--edge_tiles=0 bash "$here/ab_kernels.sh" "$bin/gemm-bench" "$bin/gemm-bench" \
        "$out/ab" 2 --quick --dtype=bfloat16 --size=2048^3 --size=2056x2056x2056 \
        --size=1032x4096x4096 --size=4096^3 --size=256 --size=1024 --size=64 >"$out/ab.txt" 2>&1
    summary+=("ab_kernels (new = --edge_tiles=1): $(grep -c '^round' "$out/ab.txt") runs")
    for edges in 0 1; do
      run "isolated_edges$edges" 150 "$bin/gemm-bench" --quick --only=grouped \
          --edge_tiles=$edges --json="$out/isolated_edges$edges.json"
    done
    if [[ -f $bin/libprofiler.so.0 ]]; then
      run host_profile 120 env CPUPROFILE="$out/launcher_1024.prof" CPUPROFILE_FREQUENCY=4000 \
          LD_PRELOAD="$bin/libprofiler.so.0" "$bin/gemm-bench" --quick --only=grouped \
          --size=1024 --reps=2000
    fi
    cat "$out/ab.txt"
    for edges in 0 1; do
      echo "== isolated, --edge_tiles=$edges"
      tail -n 14 "$out/isolated_edges$edges.log"
    done
    ;;
  *)
    echo "usage: $0 BIN_DIR OUT_DIR tests|bench" >&2
    exit 2
    ;;
esac
printf '%s\n' "${summary[@]}"
