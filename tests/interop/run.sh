#!/usr/bin/env bash
# Interop test: installs @grpc/grpc-js from npm (pinned by package-lock.json)
# into WORK_DIR, starts matmul-server on loopback and runs client.js.
#
#   run.sh WORK_DIR SERVER_BINARY PROTO_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$1 server=$2 protos=$3
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/client.js" "$work/"
cd "$work"
# Reinstall only when the lock file changed since the last install.
if ! cmp -s package-lock.json node_modules/.matmul-installed-lock 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.matmul-installed-lock
fi
port_file="$work/ports"
rm -f "$port_file"
"$server" --backend=cpu --listen=127.0.0.1:0 --metrics_listen= --port_file="$port_file" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 6000); do
  [[ -s $port_file ]] && break
  kill -0 $pid 2>/dev/null || { echo "matmul-server exited at start" >&2; exit 1; }
  sleep 0.01
done
port=$(cut -d' ' -f1 "$port_file")
node client.js "127.0.0.1:$port" "$protos" /usr/share/grpc-proto
