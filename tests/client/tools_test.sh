#!/usr/bin/env bash
# The client tools without a server: `--help` lists their own flags (absl's
# default shows only flags of a file named after the program, and none is),
# and bad arguments end with a message and status 1, not a crash.
#
#   tests/client/tools_test.sh MATMUL_CLI MATMUL_BENCH
set -uo pipefail
cli=$1 bench=$2
status=0
check() {  # binary, flags it must list...
  local bin=$1
  shift
  local out
  out=$("$bin" --help 2>&1)
  if grep -q "No flags matched" <<<"$out"; then
    echo "FAIL: $(basename "$bin") --help lists no flags"
    status=1
  fi
  for flag in "$@"; do
    if ! grep -q -- "$flag (" <<<"$out"; then
      echo "FAIL: $(basename "$bin") --help does not list $flag"
      status=1
    fi
  done
}
check "$cli" --target --m --dtype --verify --tls_ca
check "$bench" --target --echo_target --concurrency --json --duration_s
# Checked before anything is sent (port 1: nothing listens there).
for arg in --m=-3 --n=0 --k=-1; do
  out=$("$cli" multiply --target=127.0.0.1:1 "$arg" 2>&1)
  rc=$?
  name=${arg%%=*}
  if [[ $rc != 1 ]] || ! grep -q -- "$name must be at least 1" <<<"$out"; then
    echo "FAIL: matmul-cli multiply $arg: status $rc, output: $out"
    status=1
  fi
done
[[ $status == 0 ]] && echo "client tools test passed"
exit $status
