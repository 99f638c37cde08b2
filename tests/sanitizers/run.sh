#!/usr/bin/env bash
# The sanitizer stages of the test suite (run by `deploy/quickstart.sh test`
# after the main suite; MATMUL_SANITIZERS=none skips them).
#
#   tests/sanitizers/run.sh address   # CPU suite under ASan + UBSan
#   tests/sanitizers/run.sh thread    # concurrency tests under TSan
#
# address: the whole CPU build (MATMUL_CUDA=OFF) with
#   -fsanitize=address,undefined, and every CTest test except the ones that
#   run foreign binaries (the container image, Prometheus, the Kustomize
#   render) or build their own sanitized binary (the fuzzer). Leaks are
#   checked; the one suppression (tests/lsan.supp) is inside c-ares, the
#   resolver Debian's gRPC links.
# thread: the scheduler, the job queue and the matrix store (the server's
#   own concurrency)
#   under -fsanitize=thread. TSan needs every library that synchronises to
#   be instrumented; Debian ships Abseil uninstrumented, so this stage
#   builds Abseil from Debian's own source package (same version as
#   libabsl-dev) with TSan once and caches it. gRPC's core is not rebuilt,
#   so tests that run a gRPC server are not in this stage (docs/TESTING.md).
#
# Environment: JOBS (default: all cores), MATMUL_CACHE_DIR (default:
# ~/.cache/matmul), SANITIZER_BUILD_DIR (default: build-asan / build-tsan).
set -euo pipefail
mode=${1:?usage: run.sh address|thread [ctest args...]}
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
jobs="${JOBS:-$(nproc)}"
cache="${MATMUL_CACHE_DIR:-$HOME/.cache/matmul}"
log() { echo "sanitizers: $*"; }

# Builds Debian's Abseil source with TSan into $cache; prints the prefix.
tsan_abseil() {
  local version prefix apt_dir src
  version=$(dpkg-query -W -f='${Version}' libabsl-dev)
  prefix="$cache/absl-tsan-$version"
  if [[ -f $prefix/.complete ]]; then echo "$prefix"; return; fi
  apt_dir="$cache/apt-src"
  rm -rf "$apt_dir" && mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  # A private deb-src list: the machine's apt configuration is left alone.
  cat >"$apt_dir/parts/debian-src.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  local opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt_dir/parts"
              -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
              -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
  apt-get "${opts[@]}" -qq update >&2
  # The installed version when the archive still has it, else the current one.
  (cd "$apt_dir" && { apt-get "${opts[@]}" -qq source --download-only "abseil=$version" ||
                      apt-get "${opts[@]}" -qq source --download-only abseil; } >&2)
  src="$apt_dir/src"
  local build_log="$cache/absl-tsan-build.log"
  {
    dpkg-source --no-check -x "$apt_dir"/abseil_*.dsc "$src" &&
    cmake -S "$src" -B "$apt_dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_STANDARD=17 -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF \
        -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
        -DCMAKE_INSTALL_PREFIX="$prefix" &&
    cmake --build "$apt_dir/build" -j "$jobs" &&
    cmake --install "$apt_dir/build"
  } >"$build_log" 2>&1 || { tail -40 "$build_log" >&2; exit 1; }
  touch "$prefix/.complete"
  rm -rf "$apt_dir"
  echo "$prefix"
}

case "$mode" in
  address)
    build="${SANITIZER_BUILD_DIR:-build-asan}"
    start=$SECONDS
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMATMUL_CUDA=OFF \
        -DMATMUL_SANITIZE=address -DMATMUL_BUILD_TESTS=ON >/dev/null
    cmake --build "$build" -j "$jobs" >"$build/sanitizer-build.log" 2>&1 || { tail -40 "$build/sanitizer-build.log"; exit 1; }
    log "ASan+UBSan build in $((SECONDS - start)) s"
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1"
    export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    (cd "$build" && ctest --output-on-failure --timeout 1200 -j "$jobs" \
        -E '^(container_test|k8s_manifests_test|compose_test|prometheus_test|fuzz_smoke_test)$' "$@")
    log "ASan+UBSan suite clean in $((SECONDS - start)) s"
    ;;
  thread)
    build="${SANITIZER_BUILD_DIR:-build-tsan}"
    start=$SECONDS
    absl_prefix=$(tsan_abseil)
    log "TSan Abseil at $absl_prefix ($((SECONDS - start)) s)"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMATMUL_CUDA=OFF \
        -DMATMUL_SANITIZE=thread -DMATMUL_BUILD_TESTS=ON \
        -Dabsl_DIR="$absl_prefix/lib/cmake/absl" >/dev/null
    cmake --build "$build" -j "$jobs" --target dynamic_batch_scheduler_test job_queue_test matrix_store_test \
        >"$build/sanitizer-build.log" 2>&1 || { tail -40 "$build/sanitizer-build.log"; exit 1; }
    export TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
    # Several repetitions: races show up in some interleavings only.
    for test in dynamic_batch_scheduler_test job_queue_test matrix_store_test; do
      "$build/tests/$test" --gtest_repeat=3 --gtest_brief=1
    done
    log "TSan concurrency tests clean in $((SECONDS - start)) s"
    ;;
  *)
    echo "usage: $0 address|thread" >&2
    exit 2
    ;;
esac
