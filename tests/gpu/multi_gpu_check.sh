#!/usr/bin/env bash
# The multi-GPU run in one call, on a host of several NVIDIA GPUs:
#  1. nvidia-smi, and the devices a default server (every visible GPU) lists
#     in GetServerInfo (matmul-cli info);
#  2. the GPU server tests, whose EveryGpuOfTheHostServes loads every GPU
#     and checks that each one's matmul_compute_duration_seconds count grew;
#  3. the same service load (small and medium bf16 products from 64, 256
#     and 1024 callers, 4096^3 ones from 8 and 32, over 16 connections) on
#     1, 2, 4 ... GPUs (--devices=0 / 0,1 / ...): requests/s and p99 per
#     row, the host's CPU use per GPU count, so that where the limit sits
#     (GPU, host cores or transport) can be read;
#  4. one GPU made to fail (AFailedGpuWorkerFailsOnlyItsBatchAndTheOthersKeepServing,
#     part of step 2): its batch fails, health and metrics say so, the
#     others keep serving.
# On a host of one GPU, step 3 runs one row and the fault test runs on two
# workers of that GPU.
#
#   tests/gpu/multi_gpu_check.sh BUNDLE_DIR OUT_DIR [seconds per row]
#
# BUNDLE_DIR holds bin/ (matmul-server, matmul-cli, matmul-bench,
# gpu_server_test) and lib/ where shared libraries travel with them.
set -uo pipefail
shopt -s nullglob
bundle=$1 out=$2 dur=${3:-3}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
[[ -d $bundle/lib ]] && export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$bundle/bin
source "$here/run_step.sh"
summary_pattern='PASSED|FAILED|SKIPPED'

nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1
gpus=$(grep -c '^GPU ' "$out/nvidia-smi.txt")
echo "nvidia-smi: $gpus GPUs"

server=("$bin/matmul-server" --backend=cuda --listen=127.0.0.1:50061
        --metrics_listen=127.0.0.1:9191)
trap '[[ -n $server_pid ]] && kill $server_pid 2>/dev/null' EXIT

# 1. What a default server sees.
if start_server "${server[@]}"; then
  "$bin/matmul-cli" info --target=127.0.0.1:50061 >"$out/server_info.txt" 2>&1
  stop_server
  echo "GetServerInfo: $(grep -c 'cuda:' "$out/server_info.txt") cuda devices"
fi

# 2 and 4. The GPU server tests (every GPU serves; one failing GPU).
run gpu_server_test 600 env MATMUL_SERVER_BINARY="$bin/matmul-server" \
    "$bin/gpu_server_test" --gtest_brief=0

# 3. The same load on 1, 2, 4 ... GPUs.
json="$out/multi_gpu.jsonl"
rm -f "$json"
for n in 1 2 4 8; do
  (( n <= gpus )) || break
  devices=$(seq -s, 0 $((n - 1)))
  start_server "${server[@]}" --devices="$devices" || continue
  cpu0=$(awk '/^cpu /{print $2 + $3 + $4, $5}' /proc/stat)
  common=(--target=127.0.0.1:50061 --channels=16 --duration_s="$dur" --warmup_s=0.5
          --json="$json" --label="gpus=$n" --dtypes=bf16 --modes=unary)
  { "$bin/matmul-bench" run "${common[@]}" --shapes=small,medium --concurrency=64,256,1024
    "$bin/matmul-bench" run "${common[@]}" --shapes=large --concurrency=8,32; } \
      >"$out/bench_$n.log" 2>&1
  cpu1=$(awk '/^cpu /{print $2 + $3 + $4, $5}' /proc/stat)
  echo "gpus=$n host CPU busy: $(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN {
      split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2];
      printf "%.0f%%", 100 * busy / (busy + idle) }')" | tee -a "$out/cpu.txt"
  curl -s 127.0.0.1:9191/metrics | grep -E '^matmul_compute_duration_seconds_count' \
      >"$out/metrics_$n.txt"
  stop_server
done

cat "$out/nvidia-smi.txt" "$out/server_info.txt" 2>/dev/null
grep -hE 'Failure|Expected|Which is|Skipped|needs two' "$out/gpu_server_test.log" | head -20
for f in "$out"/bench_*.log; do echo "== $(basename "$f" .log)"; grep -vE '^#' "$f"; done
for f in "$out"/metrics_*.txt; do echo "== $(basename "$f" .txt)"; cat "$f"; done
printf '%s\n' "${summary[@]}"
