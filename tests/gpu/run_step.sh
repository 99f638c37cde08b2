# Sourced by the GPU scripts (run_suite.sh, run_server_suite.sh,
# tests/client/bench_smoke_test.sh for start_server,
# edge_tiles_check.sh, service_bench.sh, ...): `run NAME LIMIT COMMAND...` runs COMMAND under a
# time limit of LIMIT seconds with its output in $out/NAME.log, and adds a
# line to the array `summary` (print it last): the name, the exit status,
# the seconds taken and the log's last two lines matching $summary_pattern
# (default: GoogleTest's PASSED and FAILED lines).
summary=()
summary_pattern=${summary_pattern:-'PASSED|FAILED'}
run() {  # name, timeout, command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - start))" \
      "$(grep -E "$summary_pattern" "$out/$name.log" | tail -2 | tr '\n' ' ')")")
}

# `gpu_setup BIN_DIR OUT_DIR`: makes OUT_DIR, puts BIN_DIR/../lib (the
# bundled shared libraries, where they travel with the binaries) on the
# library path and records the GPU, its clocks and driver in OUT_DIR/gpu.txt.
gpu_setup() {
  mkdir -p "$2"
  [[ -d $1/../lib ]] && export LD_LIBRARY_PATH="$1/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv \
      >"$2/gpu.txt" 2>&1
}

# `start_server COMMAND...` starts a matmul-server in the background (COMMAND
# is its binary and flags; --port_file=$out/ports is added), appending its
# output to $out/server.log, and returns once it has bound its ports; it
# returns 1 with the log's tail if the server exits first or a minute passes.
# `stop_server` sends SIGTERM and waits for the drain and exit. Both keep the
# pid in server_pid (empty while none runs), for the caller's EXIT trap.
server_pid=
start_server() {
  rm -f "$out/ports"
  "$@" --port_file="$out/ports" >>"$out/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    [[ -s $out/ports ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "server did not start"; tail -3 "$out/server.log"
  kill "$server_pid" 2>/dev/null
  server_pid=
  return 1
}
stop_server() { kill -TERM "$server_pid"; wait "$server_pid"; server_pid=; }
