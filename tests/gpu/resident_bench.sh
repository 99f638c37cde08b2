#!/usr/bin/env bash
# Resident-operand benchmark on a GPU machine: a fixed 4096 x 4096 B times
# streamed A (1..256 rows), B inline in every request vs stored once on the
# server (PutMatrix) and named by handle, each beside a gRPC echo of the
# bytes that actually travel; then a 10-product chain inline vs kept on the
# server (store_result); and the same loads with operands and results in
# POSIX shared memory (--operands=shm).
#
#   tests/gpu/resident_bench.sh BIN_DIR OUT_DIR
set -uo pipefail
bin=$1 out=$2
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
json="$out/resident.jsonl"
rm -f "$json"
"$bin/matmul-bench" serve-echo --listen=127.0.0.1:50062 >"$out/echo.log" 2>&1 &
echo_pid=$!
rm -f "$out/ports"
"$bin/matmul-server" --backend=cuda --shared_memory --listen=127.0.0.1:50061 --metrics_listen=127.0.0.1:9091 \
    --port_file="$out/ports" >"$out/resident_server.log" 2>&1 &
server_pid=$!
trap 'kill $echo_pid $server_pid 2>/dev/null' EXIT
for _ in $(seq 600); do [[ -s $out/ports ]] && break; sleep 0.1; done
[[ -s $out/ports ]] || { echo "server did not start"; tail "$out/resident_server.log"; exit 1; }
common=(--target=127.0.0.1:50061 --echo_target=127.0.0.1:50062 --channels=8 --duration_s=3
        --warmup_s=0.5 --json="$json")
"$bin/matmul-bench" run "${common[@]}" --label=weights --shapes=weights4096 --dtypes=bf16 \
    --operands=inline,resident,shm --concurrency=1,8,32,64 --modes=unary
"$bin/matmul-bench" run "${common[@]}" --label=small-shm --shapes=small --dtypes=bf16 \
    --operands=inline,shm --concurrency=1,64,256 --modes=unary
"$bin/matmul-bench" chain --target=127.0.0.1:50061 --shapes=4096 --dtypes=bf16,f32 \
    --chain_length=10 --json="$json"
curl -s 127.0.0.1:9091/metrics | grep -E '^matmul_(resident|batch_size_(sum|count)|requests_total)' \
    >"$out/resident_metrics.txt"
kill -TERM $server_pid; wait $server_pid
echo "rows: $(wc -l <"$json")"
