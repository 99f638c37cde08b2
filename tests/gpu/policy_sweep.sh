#!/usr/bin/env bash
# Batching-policy sweep on a GPU machine: the same small-request load against
# matmul-server under several dispatch settings, beside a plain gRPC echo of
# the same bytes, alternating settings over ROUNDS so that drift falls on all.
# It answers one question: which dispatch policy serves small requests below
# saturation best (requests per second and p99), and how far is that from the
# transport's own ceiling. A second table splits each setting's median
# latency into the server's queue and engine time and the transport's share.
#
#   tests/gpu/policy_sweep.sh BIN_DIR OUT_DIR [ROUNDS]
#
# BACKEND=cpu runs it against the CPU engine (a check of the script itself on
# a machine without a GPU). SETTINGS overrides the list of "name:flags" items
# (flags comma-separated), e.g. SETTINGS="d100: e2:--dispatch_below_running=2".
set -uo pipefail
bin=$1 out=$2 rounds=${3:-2}
backend=${BACKEND:-cuda}
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
json="$out/policy.jsonl"
rm -f "$json"
dur=${DURATION_S:-1.5}
conc=${CONCURRENCY:-16,64,256}
read -r -a settings <<<"${SETTINGS:-d100: d25:--max_queue_delay_us=25 d0:--max_queue_delay_us=0 e2:--dispatch_below_running=2 e3:--dispatch_below_running=3}"

"$bin/matmul-bench" serve-echo --listen=127.0.0.1:50052 >"$out/echo.log" 2>&1 &
echo_pid=$!
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_step.sh"
trap 'kill $echo_pid $server_pid 2>/dev/null' EXIT
server=("$bin/matmul-server" --backend="$backend" --listen=127.0.0.1:50051
        --metrics_listen=127.0.0.1:0)

for ((r = 1; r <= rounds; ++r)); do
  for item in "${settings[@]}"; do
    name=${item%%:*} flags=${item#*:}
    IFS=, read -r -a extra <<<"$flags"
    echo "round $r: $name ${extra[*]}" | tee -a "$out/server.log"
    start_server "${server[@]}" "${extra[@]}" || exit 1
    echo_arg=()
    [[ $r == 1 && $item == "${settings[0]}" ]] && echo_arg=(--echo_target=127.0.0.1:50052)
    "$bin/matmul-bench" run --target=127.0.0.1:50051 "${echo_arg[@]}" --channels=8 \
        --duration_s="$dur" --warmup_s=0.3 --json="$json" --label="$name" \
        --shapes=small --dtypes=bf16,f32 --concurrency="$conc" --modes=unary \
        >>"$out/bench.log" 2>&1
    echo "  rc=$?"
    stop_server
  done
done

python3 - "$json" <<'PY'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    label = "echo" if r["target"] == "echo" else r["label"]
    rows[(r["dtype"], r["concurrency"], label)].append(r)
labels = []
for (_, _, label) in rows:
    if label not in labels:
        labels.append(label)
print(f"{'dtype':<6} {'callers':>7} " + " ".join(f"{l + ' req/s':>12} {'p99 ms':>7}" for l in labels))
for dtype, conc in sorted({(d, c) for (d, c, _) in rows}):
    cells = []
    for l in labels:
        rs = rows.get((dtype, conc, l), [])
        if not rs:
            cells.append(f"{'-':>12} {'-':>7}")
            continue
        cells.append(f"{statistics.median(x['rps'] for x in rs):>12.0f} "
                     f"{statistics.median(x['p99_ms'] for x in rs):>7.2f}")
    print(f"{dtype:<6} {conc:>7} " + " ".join(cells))
# Where a request's time goes (medians over rounds, us): the client's p50,
# the server's arrival-to-answer, its queue and engine parts (matmul-bench's
# Timing columns), the mean batch size, and "wire": the p50 of each call's
# latency less the server's own time (the echo's: its whole latency), so
# that the transport's overhead reads apart from queue and engine time.
print()
print(f"{'dtype':<6} {'callers':>7} {'setting':<10} {'client':>7} {'server':>7} {'queue':>7} "
      f"{'engine':>7} {'batch':>6} {'wire':>7} {'wire/echo':>9}")
for (dtype, conc, label), rs in sorted(rows.items()):
    if "server_total_p50_us" not in rs[0]:
        continue
    med = lambda key, rs=rs: statistics.median(x.get(key, 0) for x in rs)
    echo = rows.get((dtype, conc, "echo"), [])
    echo_p50 = statistics.median(x["p50_ms"] for x in echo) if echo else 0
    wire = med("transport_p50_ms")
    ratio = f"{wire / echo_p50:>9.2f}" if wire and echo_p50 else f"{'-':>9}"
    print(f"{dtype:<6} {conc:>7} {label:<10} {med('p50_ms') * 1000:>7.0f} "
          f"{med('server_total_p50_us'):>7.0f} {med('server_queue_p50_us'):>7.0f} "
          f"{med('server_compute_p50_us'):>7.0f} {med('mean_batch'):>6.2f} "
          f"{wire * 1000:>7.0f} {ratio}")
PY
