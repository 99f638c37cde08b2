#!/usr/bin/env bash
# Times the exact-float32 SIMT kernel's variants against the shipped one in
# one run on a machine with an NVIDIA GPU: the shipped kernel (gemm-bench)
# and each MATMUL_SIMT_WIDE variant of gemm-bench-diag (see LaunchSimtGemm
# in kernels/cuda/simt_gemm.cu), ROUNDS times alternating, so that clock
# and temperature drift fall on all of them. Isolated timing, float32 rows
# from 2048^3 up on 128 x 128 tiles (--simt_tile=128; the tall variant cuts
# its own 256 x 128 tiles).
#
#   tests/gpu/simt_variants.sh BIN_DIR OUT_DIR [ROUNDS] [VARIANT...]
#
# BIN_DIR holds gemm-bench and gemm-bench-diag (and ../lib where shared
# libraries travel with them). Default variants: 16,2,copy4 (the shipped
# kernel built the diagnostic way, a control) 16,2,async 16,2,regs.
# Logs go to OUT_DIR; a table of x cuBLAS and rel.err per row and variant
# is printed last (a variant that computes wrong shows in rel.err, which
# compares it with cuBLAS; one that fails to launch shows as a missing row).
set -uo pipefail
bin=$1 out=$2 rounds=${3:-2}
shift $(( $# >= 3 ? 3 : 2 ))
variants=("$@")
[[ ${#variants[@]} -gt 0 ]] || variants=(16,2,copy4 16,2,async 16,2,regs)
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rows=(--quick --only=single --dtype=float32 --size=2048^3 --size=4096^3 --size=8192^3
      --size=4096x11008x4096 --simt_tile=128)
for ((r = 1; r <= rounds; ++r)); do
  timeout 60 "$bin/gemm-bench" "${rows[@]}" >"$out/shipped_$r.log" 2>&1
  for v in "${variants[@]}"; do
    MATMUL_SIMT_WIDE=$v timeout 60 "$bin/gemm-bench-diag" "${rows[@]}" >"$out/${v}_$r.log" 2>&1
  done
done
printf '%-14s %-6s %-18s %9s %9s\n' variant round problem "x cuBLAS" rel.err
for f in "$out"/*_[0-9]*.log; do
  name=$(basename "$f" .log)
  awk -v v="${name%_*}" -v r="${name##*_}" \
    '$1 == "single" && $3 == "float32" && $4 == "ours" && $5 == "persistent" {
       printf "%-14s %-6s %-18s %9s %9s\n", v, r, $2, $9, $10 }' "$f"
done
