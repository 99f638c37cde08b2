#!/usr/bin/env bash
# matmul-bench against a CPU matmul-server: a short closed-loop row, unary
# and stream, whose JSON must carry the client's latencies and the server's
# own Timing (queue, engine, arrival to answer, batch size) in a consistent
# order. Ports are picked by the server (port 0).
#
#   tests/client/bench_smoke_test.sh MATMUL_SERVER MATMUL_BENCH
set -euo pipefail
server_bin=$1 bench_bin=$2
out=$(mktemp -d)
# start_server / stop_server (they write $out/ports and $out/server.log).
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../gpu/run_step.sh"
trap '[[ -n $server_pid ]] && kill $server_pid 2>/dev/null; rm -rf "$out"' EXIT

start_server "$server_bin" --backend=cpu --listen=127.0.0.1:0 --metrics_listen= || exit 1
read -r port _ <"$out/ports"

"$bench_bin" run --target="127.0.0.1:$port" --channels=2 --duration_s=0.5 --warmup_s=0.2 \
    --shapes=small --dtypes=bf16,f32 --concurrency=4 --modes=unary,stream \
    --json="$out/rows.jsonl" --label=smoke

/usr/bin/python3 - "$out/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 4, f"expected 4 rows (2 dtypes x 2 modes), got {len(rows)}"
for r in rows:
    what = f"{r['dtype']} {r['mode']}"
    assert r["errors"] == 0, f"{what}: {r['errors']} errors"
    assert r["requests"] > 0 and r["rps"] > 0, f"{what}: no requests"
    assert 0 < r["p50_ms"] <= r["p99_ms"], f"{what}: percentiles {r['p50_ms']} {r['p99_ms']}"
    srv, q, c = r["server_total_p50_us"], r["server_queue_p50_us"], r["server_compute_p50_us"]
    assert srv > 0, f"{what}: no server Timing recorded"
    # The server's part of a request cannot take longer than the client saw
    # (medians of the same requests; 1 us of rounding allowed).
    assert srv <= r["p50_ms"] * 1000 + 1, f"{what}: server {srv} us > client p50 {r['p50_ms']} ms"
    assert q + c <= srv * 2 + 2, f"{what}: queue {q} + engine {c} us against total {srv} us"
    assert r["mean_batch"] >= 1, f"{what}: mean batch {r['mean_batch']}"
    # Each call's time outside the server: positive (the server's part lies
    # inside the client's send-to-answer window, one host, one clock) and at
    # most the call's latency.
    t50, t99 = r["transport_p50_ms"], r["transport_p99_ms"]
    assert 0 < t50 <= t99 <= r["p999_ms"], f"{what}: transport p50 {t50} p99 {t99} ms"
    assert t50 <= r["p50_ms"], f"{what}: transport p50 {t50} > client p50 {r['p50_ms']} ms"
    print(f"{what}: client p50 {r['p50_ms'] * 1000:.0f} us, server {srv:.0f} us "
          f"(queue {q:.0f}, engine {c:.0f}), wire {t50 * 1000:.0f} us, "
          f"mean batch {r['mean_batch']:.2f}")
PY
# Bad arguments end with status 2 and a message naming what was wrong.
for arg in --shapes=-4x4x4 --shapes=0x5x5 --modes=bidi --concurrency=0 --dtypes=int8; do
  set +e
  msg=$("$bench_bin" run --target="127.0.0.1:$port" --duration_s=0.1 --warmup_s=0 "$arg" 2>&1)
  rc=$?
  set -e
  value=${arg#*=}
  if [[ $rc != 2 ]] || ! grep -q -- "$value" <<<"$(grep matmul-bench: <<<"$msg")"; then
    echo "FAIL: matmul-bench run $arg: status $rc, output: $msg"
    exit 1
  fi
done
stop_server
echo "bench smoke test passed"
