#!/usr/bin/env bash
# The twenty-fifth round's A/B on a GPU machine (docs/BENCHMARKS.md): the
# engine's staging copies spread over the copy pool and the TF32 plan (NEW)
# against a build without them (OLD): the engine and TF32 tests, then
# engine-bench and the grouped rows of gemm-bench in alternating rounds,
# then the small-request service sweep for each build.
#
#   tests/gpu/staging_check.sh NEW_BIN_DIR OLD_BIN_DIR OUT_DIR
#
# NEW_BIN_DIR holds cuda_engine_test, grouped_gemm_test, engine-bench,
# gemm-bench, matmul-server and matmul-bench; OLD_BIN_DIR engine-bench,
# gemm-bench and matmul-server of the build to compare with (a lib/ beside
# either when the shared libraries travel with them). About 5 minutes.
set -uo pipefail
new=$1 old=$2 out=$3
source "$(dirname "${BASH_SOURCE[0]}")/run_step.sh"
gpu_setup "$new" "$out"
[[ -d $old/../lib ]] && export LD_LIBRARY_PATH="$old/../lib:$LD_LIBRARY_PATH"
cat "$out/gpu.txt"
run cuda_engine_test 120 "$new/cuda_engine_test" --gtest_brief=1
run grouped_tf32 120 "$new/grouped_gemm_test" --gtest_brief=1 --gtest_filter='*Tf32*'
printf '%s\n' "${summary[@]}"
dir() { [[ $1 == new ]] && echo "$new" || echo "$old"; }
engine() {  # build round
  timeout 100 "$(dir "$1")/engine-bench" --reps=200 --json="$out/eb_$1_$2.json" >"$out/eb_$1_$2.log" 2>&1
  echo "== engine-bench $1 round $2 rc=$?"; grep -A10 '^dtype' "$out/eb_$1_$2.log" | cut -c1-110
}
grouped() {
  timeout 80 "$(dir "$1")/gemm-bench" --only=grouped --dtype=tf32 --dtype=bfloat16 --size=1024 \
      --size=256 --json="$out/gb_$1_$2.json" >"$out/gb_$1_$2.log" 2>&1
  echo "== gemm-bench $1 round $2 rc=$?"
  grep -E 'ours persistent|GroupedBatchedEx' "$out/gb_$1_$2.log" | cut -c1-120
}
engine old 1; engine new 1; grouped old 1; grouped new 1
engine new 2; engine old 2; grouped new 2; grouped old 2
for v in old new; do
  d=$(mktemp -d)
  ln -s "$new/matmul-bench" "$d/matmul-bench"
  ln -s "$(dir $v)/matmul-server" "$d/matmul-server"
  BACKEND=cuda CONCURRENCY=16,64,256 DURATION_S=1.5 SETTINGS="d25:" \
    timeout 150 bash "$(dirname "${BASH_SOURCE[0]}")/policy_sweep.sh" "$d" "$out/policy_$v" 1 \
    >"$out/policy_$v.txt" 2>&1
  echo "== service sweep $v rc=$?"; tail -22 "$out/policy_$v.txt"
done
