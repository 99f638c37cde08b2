#!/usr/bin/env bash
# The GPU run behind the launcher's choice of pairs of CTAs (2-CTA clusters
# sharing B by TMA multicast; hopper_plan.h, PairsPay; docs/BENCHMARKS.md,
# twenty-second round): the kernel tests in full with that choice, and
# pairs against single CTAs where the choice is still open. About five
# minutes; run it again after changes to the pairs' pipeline or the choice:
#
#   tests/gpu/pairs_check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds grouped_gemm_test, cuda_engine_test and gemm-bench (and a
# lib/ beside it when the shared libraries travel with them). Steps: the
# whole grouped_gemm_test (ChosenPairs says which batches run in pairs;
# the suite takes 90-190 s on an H100 host, mostly the float64 reference
# on the host) and cuda_engine_test; then gemm-bench with --cluster=1
# against --cluster=2, two rounds each: the grouped batches in bf16 and
# TF32 (TF32 batches stay single CTAs until measured), and odd single bf16
# problems (rows off 32-byte sectors, where a single problem of two waves
# or more now runs in pairs) with an aligned control. Read the ratios to
# cuBLAS within each run; each run draws its own grouped shapes. With
# SANITIZE=1, compute-sanitizer's racecheck and synccheck then run over
# ChosenPairs (the pairs' unit ring and stage releases; the tools slow
# kernels 10-100x, so this step alone may take minutes).
set -uo pipefail
bin=$1 out=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_step.sh"
gpu_setup "$bin" "$out"
run grouped_gemm_test 300 "$bin/grouped_gemm_test" --gtest_brief=1
run cuda_engine_test 150 "$bin/cuda_engine_test" --gtest_brief=1
grep -hE 'Failure|Expected|Which is|differs' "$out"/*_test.log | head -20
singles=(--only=single --dtype=bfloat16 --size=3000x3000x3000 --size=4104x4104x4104
         --size=2056x2056x2056 --size=4096^3)
for round in 1 2; do
  for c in 1 2; do
    run "grouped_c${c}_r$round" 120 "$bin/gemm-bench" --only=grouped --dtype=bfloat16 \
        --dtype=tf32 --cluster=$c --json="$out/grouped_c${c}_r$round.json"
    run "odd_c${c}_r$round" 60 "$bin/gemm-bench" "${singles[@]}" --cluster=$c \
        --json="$out/odd_c${c}_r$round.json"
  done
done
if [[ ${SANITIZE:-0} == 1 ]]; then
  for tool in racecheck synccheck; do
    run "$tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 1 \
        "$bin/grouped_gemm_test" --gtest_brief=1 --gtest_filter='*ChosenPairs*'
  done
fi
for f in "$out"/grouped_c*_r1.log "$out"/odd_c*_r1.log; do
  echo "== $(basename "$f" .log)"
  grep -E 'ours persistent|cuBLAS' "$f" | cut -c1-150
done
printf '%s\n' "${summary[@]}"
