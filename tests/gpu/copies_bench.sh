#!/usr/bin/env bash
# Host-copy benchmark on a GPU machine: two matmul-server builds (before and
# after a change to the payload path) under the same loads, one after the
# other, each row beside a gRPC echo of the bytes it moves. Besides req/s it
# reports the server's own CPU time per request (utime + stime from /proc),
# which is what host copies cost and is far less noisy than throughput.
#
#   [BEFORE_FLAGS=...] [AFTER_FLAGS=...] tests/gpu/copies_bench.sh BEFORE_BIN AFTER_BIN OUT_DIR
# Both BIN dirs hold matmul-server; AFTER_BIN also matmul-bench (the client
# is the same for both). BEFORE_FLAGS and AFTER_FLAGS add server flags, and
# BEFORE_BENCH_FLAGS and AFTER_BENCH_FLAGS client flags, so one build can also
# be compared with itself under two settings; BEFORE_ENV and AFTER_ENV set
# the server's environment (e.g. AFTER_ENV=LD_PRELOAD=/path/libtcmalloc.so).
# cpu.tsv also gives the echo server's CPU per request in the same rows: the
# transport's own cost, against which the server's is read.
# ROWS_FILE names a file of rows ("name|matmul-bench flags" a line) to run
# instead of the GPU rows below; with MATMUL_BACKEND=cpu and tiny shapes it
# measures the service's own per-request cost on any machine, e.g.
#   printf 'tiny-f32|--shapes=16x16x16 --dtypes=f32 --concurrency=64 --modes=unary\n' >rows
#   MATMUL_BACKEND=cpu ROWS_FILE=rows tests/gpu/copies_bench.sh OLD/bin NEW/bin out
set -uo pipefail
before=$1 after=$2 out=$3
mkdir -p "$out"
[[ -d $after/../lib ]] && export LD_LIBRARY_PATH="$after/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench="$after/matmul-bench"
json="$out/copies.jsonl"
rm -f "$json" "$out/cpu.tsv"
"$bench" serve-echo --listen=127.0.0.1:50072 >"$out/echo.log" 2>&1 &
echo_pid=$!
server_pid=
trap 'kill $echo_pid $server_pid 2>/dev/null' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
requests() { curl -s 127.0.0.1:9093/metrics | awk '/^matmul_requests_total/ {s += $2} END {print s + 0}'; }
hz=$(getconf CLK_TCK)
for variant in before after; do
  bin=$before; [[ $variant == after ]] && bin=$after
  rm -f "$out/ports"
  flags_var=${variant^^}_FLAGS bench_flags_var=${variant^^}_BENCH_FLAGS env_var=${variant^^}_ENV
  # shellcheck disable=SC2086
  env ${!env_var:-} "$bin/matmul-server" --backend="${MATMUL_BACKEND:-cuda}" ${!flags_var:-} --listen=127.0.0.1:50071 --metrics_listen=127.0.0.1:9093 \
      --port_file="$out/ports" >"$out/server_$variant.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do [[ -s $out/ports ]] && break; sleep 0.1; done
  [[ -s $out/ports ]] || { echo "$variant server did not start"; tail "$out/server_$variant.log"; exit 1; }
  common=(--target=127.0.0.1:50071 --echo_target=127.0.0.1:50072 --channels=8 --duration_s=${MATMUL_BENCH_S:-2}
          --warmup_s=0.3 --json="$json" --label="$variant")
  # name | bench flags
  while IFS='|' read -r name flags; do
    t0=$(ticks $server_pid) r0=$(requests) e0=$(ticks $echo_pid) l0=$(cat "$json" 2>/dev/null | wc -l)
    # shellcheck disable=SC2086
    "$bench" run "${common[@]}" ${!bench_flags_var:-} $flags >>"$out/bench_$variant.log" 2>&1
    t1=$(ticks $server_pid) r1=$(requests) e1=$(ticks $echo_pid)
    # Echo calls of this row: its echo lines' request counts, which leave
    # out the warm-up (taken to run at the same rate).
    er=$(tail -n +$((l0 + 1)) "$json" | awk '/"target": "echo"/ {
           match($0, /"requests": [0-9]+/); s += substr($0, RSTART + 12, RLENGTH - 12)} END {print s + 0}')
    awk -v v="$variant" -v n="$name" -v t=$((t1 - t0)) -v r=$((r1 - r0)) -v hz="$hz" \
        -v et=$((e1 - e0)) -v er="$er" -v scale="$(awk -v d="${MATMUL_BENCH_S:-2}" 'BEGIN {print (d + 0.3) / d}')" \
        'BEGIN {printf "%s\t%s\t%d\t%.1f\t%.1f\n", v, n, r, (r > 0 ? t / hz * 1e6 / r : 0),
                (er > 0 ? et / hz * 1e6 / (er * scale) : 0)}' >>"$out/cpu.tsv"
  done < <(if [[ -n ${ROWS_FILE:-} ]]; then cat "$ROWS_FILE"; else cat <<'ROWS'
resident-weights|--shapes=weights4096 --dtypes=bf16 --operands=resident --concurrency=8,64 --modes=unary
medium-bf16|--shapes=medium --dtypes=bf16 --concurrency=8 --modes=unary
medium-f32|--shapes=medium --dtypes=f32 --concurrency=8 --modes=unary
small-bf16|--shapes=small --dtypes=bf16 --concurrency=256 --modes=unary,stream
small-f32|--shapes=small --dtypes=f32 --concurrency=256 --modes=unary
ROWS
  fi)
  kill -TERM $server_pid; wait $server_pid; server_pid=
done
echo "variant	load	requests	server_cpu_us_per_request	echo_cpu_us_per_request"
cat "$out/cpu.tsv"
echo "rows: $(wc -l <"$json")"
