#!/usr/bin/env bash
# `--help` of the client tools lists their own flags (absl's default shows
# only flags of a file named after the program, and none is).
#
#   tests/client/help_test.sh MATMUL_CLI MATMUL_BENCH
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
[[ $status == 0 ]] && echo "help test passed"
exit $status
