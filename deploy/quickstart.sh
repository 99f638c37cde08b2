#!/usr/bin/env bash
# The two commands of the README:
#
#   deploy/quickstart.sh serve [matmul-server flags...]
#       installs what is missing (apt), builds, and starts matmul-server on
#       its default ports (gRPC :50051, metrics :9090), on the GPU when one is
#       usable and on the CPU engine otherwise.
#   deploy/quickstart.sh test
#       installs what is missing, builds, and runs the whole test suite
#       (what CI runs).
#
# Environment: BUILD_DIR (default: build), MATMUL_CUDA (AUTO|ON|OFF),
# JOBS (parallel build jobs, default: all cores), MATMUL_SANITIZERS (all|none:
# whether `test` also runs the ASan+UBSan and TSan stages; default all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

build() {
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMATMUL_CUDA="${MATMUL_CUDA:-AUTO}" "$@"
  cmake --build "$build_dir" -j "$jobs"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  serve)
    deploy/install-deps.sh build
    build -DMATMUL_BUILD_TESTS=OFF
    # Idle OpenBLAS threads sleep at once instead of spinning (as in the images).
    export OPENBLAS_THREAD_TIMEOUT="${OPENBLAS_THREAD_TIMEOUT:-4}"
    exec "$build_dir/server/matmul-server" "$@"
    ;;
  test)
    deploy/install-deps.sh build test
    build -DMATMUL_BUILD_TESTS=ON
    (cd "$build_dir" && ctest --output-on-failure --timeout 1200 -j "$jobs" "$@")
    # Then the CPU suite under ASan + UBSan and the concurrency tests under
    # TSan (tests/sanitizers/run.sh); MATMUL_SANITIZERS=none skips them.
    case "${MATMUL_SANITIZERS:-all}" in
      all) JOBS="$jobs" tests/sanitizers/run.sh address
           JOBS="$jobs" tests/sanitizers/run.sh thread ;;
      none) echo "quickstart: sanitizer stages skipped (MATMUL_SANITIZERS=none)" ;;
      *) echo "MATMUL_SANITIZERS must be all or none" >&2; exit 2 ;;
    esac
    ;;
  *)
    echo "usage: $0 serve [server flags...] | test [ctest args...]" >&2
    exit 2
    ;;
esac
