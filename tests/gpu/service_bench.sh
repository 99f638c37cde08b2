#!/usr/bin/env bash
# Service benchmark on a GPU machine: matmul-server --backend=cuda against a
# plain gRPC echo of the same bytes over the same connections, then the same
# small-request load with batching off (--max_batch_size=1).
#
#   tests/gpu/service_bench.sh BIN_DIR OUT_DIR [quick]
set -uo pipefail
bin=$1 out=$2 mode=${3:-full}
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
json="$out/service.jsonl"
rm -f "$json"
dur=2 warm=0.3 small_conc=1,16,64,256,512 big_conc=1,8,32
[[ $mode == quick ]] && dur=1 warm=0.2 small_conc=1,64,512 big_conc=1,8

"$bin/matmul-bench" serve-echo --listen=127.0.0.1:50052 >"$out/echo.log" 2>&1 &
echo_pid=$!
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_step.sh"
server=("$bin/matmul-server" --backend=cuda --listen=127.0.0.1:50051
        --metrics_listen=127.0.0.1:9090)
trap 'kill $echo_pid $server_pid 2>/dev/null' EXIT
common=(--target=127.0.0.1:50051 --channels=8 --duration_s=$dur --warmup_s=$warm --json="$json")

start_server "${server[@]}" || exit 1
"$bin/matmul-bench" run "${common[@]}" --echo_target=127.0.0.1:50052 --label=batching-on \
    --shapes=small --dtypes=bf16,f32 --concurrency=$small_conc --modes=unary,stream
"$bin/matmul-bench" run "${common[@]}" --echo_target=127.0.0.1:50052 --label=batching-on \
    --shapes=medium,large --dtypes=bf16,f32 --concurrency=$big_conc --modes=unary
curl -s 127.0.0.1:9090/metrics | grep -E '^matmul_(batch_size_(sum|count)|requests_total|rejected_total)' >"$out/metrics_on.txt"
stop_server

start_server "${server[@]}" --max_batch_size=1 || exit 1
"$bin/matmul-bench" run "${common[@]}" --label=batching-off \
    --shapes=small --dtypes=bf16,f32 --concurrency=$small_conc --modes=unary
stop_server
echo "rows: $(wc -l <"$json")"
