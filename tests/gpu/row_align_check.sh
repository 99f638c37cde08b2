#!/usr/bin/env bash
# The GPU run behind CudaEngineOptions::resident_row_align's default
# (--cuda_resident_row_align, 32 since the eleventh kernel round in
# docs/BENCHMARKS.md): whether rows that start on sectors or lines make the
# kernel faster on odd widths, and the engine's tests with 128-byte
# resident rows. One call of about four minutes; run it again after
# changes to the kernel's loads or to the engine's layouts:
#
#   tests/gpu/row_align_check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds cuda_engine_test, gemm-bench, matmul-server and
# gpu_server_test (and a lib/ beside it when the shared libraries travel
# with them). Steps: cuda_engine_test (its fixture keeps long resident rows
# on 128 bytes); gemm-bench single bf16 problems with odd widths (2056^3,
# 3000^3: rows 16 bytes off a sector) and 4096^3 (aligned, the control) in
# alternating rounds with --row_align=128 against packed rows; one run with
# --row_align=32; gpu_server_test. Read the table by the odd rows' change
# and the control's (which should not move).
set -uo pipefail
bin=$1 out=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_step.sh"
gpu_setup "$bin" "$out"
run cuda_engine_test 150 "$bin/cuda_engine_test" --gtest_brief=1
grep -hE 'Failure|Expected|Which is|resident mask' "$out"/cuda_engine_test.log | head -20
sizes=(--quick --only=single --dtype=bfloat16 --size=2056x2056x2056 --size=3000x3000x3000
       --size=4096^3)
NEW_FLAGS=--row_align=128 BASE_FLAGS=--row_align=0 timeout 200 bash "$here/ab_kernels.sh" \
    "$bin/gemm-bench" "$bin/gemm-bench" "$out/ab" 2 "${sizes[@]}" >"$out/ab.txt" 2>&1
summary+=("ab_kernels (new = --row_align=128): $(grep -c '^round' "$out/ab.txt") runs")
run align32 60 "$bin/gemm-bench" "${sizes[@]}" --row_align=32 --timing=back-to-back \
    --json="$out/align32.json"
run gpu_server_test 100 env MATMUL_SERVER_BINARY="$bin/matmul-server" \
    "$bin/gpu_server_test" --gtest_brief=1
tail -n 12 "$out/ab.txt"
echo "== --row_align=32, back-to-back"
grep -E 'ours persistent|cuBLAS' "$out/align32.log"
printf '%s\n' "${summary[@]}"
