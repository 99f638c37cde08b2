#!/usr/bin/env bash
# Builds the Dockerfile's cpu target with podman for real and serves from the
# image's file system: podman cannot run containers in this sandbox (it
# refuses setrlimit), so the test mounts the image and starts its entrypoint
# under chroot with the image's user and environment, then calls it (health
# SERVING, a correct Multiply) and stops it with SIGTERM (exit 0).
#
#   container_test.sh SOURCE_DIR BUILD_DIR
#
# The base image (Debian bookworm, made with debootstrap since no registry
# is reachable) is tagged docker.io/library/debian:bookworm-slim and cached
# in podman's storage and as a tarball under $MATMUL_IMAGE_CACHE.
set -euo pipefail
src=$1 build=$2
cache=${MATMUL_IMAGE_CACHE:-/var/cache/matmul}
image=localhost/matmul-server:cpu
base=docker.io/library/debian:bookworm-slim
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo -n)

log() { echo "container_test: $*"; }

# 1. The base image.
if ! "${sudo[@]}" podman image exists "$base"; then
  "${sudo[@]}" mkdir -p "$cache"
  if [[ ! -s $cache/bookworm-minbase.tar ]]; then
    log "making the base image with debootstrap (once; cached in $cache)"
    rootfs=$(mktemp -d)
    "${sudo[@]}" debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    "${sudo[@]}" tar -C "$rootfs" -cf "$cache/bookworm-minbase.tar" .
    "${sudo[@]}" rm -rf "$rootfs"
  fi
  "${sudo[@]}" podman import "$cache/bookworm-minbase.tar" "$base" >/dev/null
fi

# 2. The image.
log "building $image"
start=$SECONDS
"${sudo[@]}" podman build --isolation=chroot --cgroup-manager=cgroupfs --pull=never --target cpu \
    --build-arg MATMUL_BUILD_COMMIT="$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
    -t "$image" "$src" >"$build/container_build.log" 2>&1 || { tail -40 "$build/container_build.log"; exit 1; }
log "built in $((SECONDS - start)) s"

# 3. What the image declares.
user=$("${sudo[@]}" podman image inspect "$image" --format '{{.Config.User}}')
ports=$("${sudo[@]}" podman image inspect "$image" --format '{{.Config.ExposedPorts}}')
entrypoint=$("${sudo[@]}" podman image inspect "$image" --format '{{join .Config.Entrypoint " "}}')
mapfile -t env_vars < <("${sudo[@]}" podman image inspect "$image" --format '{{join .Config.Env "\n"}}')
[[ $user == 10001:10001 ]] || { log "FAIL: user is '$user', expected non-root 10001:10001"; exit 1; }
[[ $ports == *50051/tcp* && $ports == *9090/tcp* ]] || { log "FAIL: exposed ports $ports"; exit 1; }
[[ $entrypoint == /usr/local/bin/matmul-server ]] || { log "FAIL: entrypoint '$entrypoint'"; exit 1; }

# 4. Serve from the image's file system.
ctr=$("${sudo[@]}" podman create "$image")
root=$("${sudo[@]}" podman mount "$ctr")
server_pid=
cleanup() {
  [[ -n $server_pid ]] && "${sudo[@]}" kill -KILL "$server_pid" 2>/dev/null || true
  "${sudo[@]}" umount "$root/proc" 2>/dev/null || true
  "${sudo[@]}" podman umount "$ctr" >/dev/null 2>&1 || true
  "${sudo[@]}" podman rm -f "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for tool in gcc g++ cc c++ cmake nvcc; do
  if [[ -e $root/usr/bin/$tool || -e $root/usr/local/bin/$tool ]]; then
    log "FAIL: the runtime image carries a compiler ($tool)"
    exit 1
  fi
done
"${sudo[@]}" mount -t proc proc "$root/proc"
"${sudo[@]}" rm -f "$root/tmp/ports"
# The image's environment and user; flags on the command line override it.
"${sudo[@]}" env -i "${env_vars[@]}" chroot --userspec="$user" "$root" $entrypoint \
    --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file=/tmp/ports \
    >"$build/container_server.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do [[ -s $root/tmp/ports ]] && break; sleep 0.1; done
[[ -s $root/tmp/ports ]] || { log "FAIL: server did not start"; cat "$build/container_server.log"; exit 1; }
read -r port metrics_port <"$root/tmp/ports"
grep -q "backend cpu" "$build/container_server.log" || { log "FAIL: image env MATMUL_BACKEND=cpu not applied"; exit 1; }
grep -q "OPENBLAS_THREAD_TIMEOUT=4" "$build/container_server.log" || { log "FAIL: image env OPENBLAS_THREAD_TIMEOUT=4 not applied"; exit 1; }

# 5. Call it.
PYTHONPATH="$build/tests/python" /usr/bin/python3 - "$port" <<'PY'
import sys, grpc, health_v1_pb2 as h, health_v1_pb2_grpc as hg
ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
status = hg.HealthStub(ch).Check(h.HealthCheckRequest(service="matmul.v1.MatmulService"), timeout=30).status
assert status == h.HealthCheckResponse.SERVING, status
print("container_test: health SERVING")
PY
"$build/client/matmul-cli" multiply --target="127.0.0.1:$port" --dtype=bf16 --m=200 --n=150 --k=100 \
    --transpose_b --verify
# Read the whole page first: `curl | grep -q` under pipefail fails when grep
# exits on its first match and curl is still writing.
metrics=$(curl -sf "127.0.0.1:$metrics_port/metrics") || { log "FAIL: metrics endpoint"; exit 1; }
grep -q '^matmul_requests_total{code="OK",method="Multiply"} 1' <<<"$metrics" \
    || { log "FAIL: metrics do not show the request"; exit 1; }

# 6. SIGTERM: drain and exit 0.
"${sudo[@]}" kill -TERM "$server_pid"
wait "$server_pid" && code=0 || code=$?
server_pid=
[[ $code -eq 0 ]] || { log "FAIL: server exited $code after SIGTERM"; exit 1; }
log "PASS: image $image built, served from its file system, answered, drained"
