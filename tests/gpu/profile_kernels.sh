#!/usr/bin/env bash
# Profiles our kernels against cuBLAS with Nsight Compute on a machine
# with an NVIDIA GPU: one launch each of ours and of cuBLAS's kernel for the
# problems named, with the sections that say where a GEMM's time goes
# (speed of light, memory workload, warp stalls, scheduler). Clocks are left
# as found (--clock-control none).
#
#   tests/gpu/profile_kernels.sh BIN_DIR OUT_DIR [SIZE...]
#
# SIZE: a gemm-bench single-problem label (4096^3) or grouped batch count
# (1024); default 4096^3 and 1024. Reports go to OUT_DIR/ncu_*.txt; a short
# table of the headline metrics is printed last. DTYPE (default bfloat16)
# picks the single problems' dtype; DTYPE=float32 profiles the exact-float32
# SIMT kernel (SimtWideGemm for large problems) against cuBLAS's SGEMM.
set -uo pipefail
bin=$1 out=$2
shift 2
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(4096^3 1024)
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
[[ -n $ncu ]] || { echo "profile_kernels: ncu not found" >&2; exit 1; }
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
          --section SchedulerStats --section LaunchStats)
dtype=${DTYPE:-bfloat16}
ours='regex:HopperGroupedGemm'
[[ $dtype == float32 ]] && ours='regex:Simt(Wide|Grouped)Gemm'
[[ $dtype == float32 ]] && sections+=(--section ComputeWorkloadAnalysis --section InstructionStats)
for size in "${sizes[@]}"; do
  tag=${size//^/p}
  if [[ $size == *^* || $size == *x* ]]; then
    args=(--only=single --dtype="$dtype" --size="$size")
  else
    args=(--only=grouped --size="$size" --quick)
  fi
  # Ours: the third launch (after warm-up).
  timeout 240 "$ncu" --clock-control none -k "$ours" --launch-skip 3 --launch-count 1 \
    "${sections[@]}" "$bin/gemm-bench" "${args[@]}" --json=/dev/null >"$out/ncu_ours_$tag.txt" 2>&1
  # cuBLAS's kernel for the same problem (its names vary by version).
  timeout 240 "$ncu" --clock-control none -k 'regex:^(?!.*(HopperGroupedGemm|Simt))(.*(gemm|nvjet|sm90|cutlass).*)' \
    --launch-skip 3 --launch-count 1 \
    "${sections[@]}" "$bin/gemm-bench" "${args[@]}" --json=/dev/null >"$out/ncu_cublas_$tag.txt" 2>&1
done
printf '%-34s %14s %10s %10s %10s %10s %10s\n' report duration_us sm_thru% mem_thru% l2_thru% dram_thru% regs
for f in "$out"/ncu_*.txt; do
  pick() { grep -m1 -E "^ +$1 " "$f" | awk '{print $NF}'; }
  printf '%-34s %14s %10s %10s %10s %10s %10s\n' "$(basename "$f" .txt)" "$(pick Duration)" \
    "$(pick 'Compute \(SM\) Throughput')" "$(pick 'Memory Throughput')" "$(pick 'L2 Cache Throughput')" \
    "$(pick 'DRAM Throughput')" "$(pick 'Registers Per Thread')"
  grep -m1 -E '^  [A-Za-z_].*\(' "$f" | cut -c1-120
done
