#!/usr/bin/env bash
# Runs the server-level GPU checks on a machine with an NVIDIA GPU: the C++
# GPU server tests, the Python client tests against --backend=cuda, and the
# service benchmark.
#
#   tests/gpu/run_server_suite.sh BUNDLE_DIR OUT_DIR [quick|full]
#
# BUNDLE_DIR holds bin/ (matmul-server, matmul-bench, gpu_server_test),
# lib/ when shared libraries travel along, python/ (the client package and
# stubs) and tests/python/ (the Python tests and their stubs).
set -uo pipefail
bundle=$1 out=$2 mode=${3:-full}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
[[ -d $bundle/lib ]] && export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary_pattern='PASSED|FAILED|^Ran |^OK|^FAILED'
source "$here/run_step.sh"
run gpu_server_test 300 env MATMUL_SERVER_BINARY="$bundle/bin/matmul-server" \
    "$bundle/bin/gpu_server_test" --gtest_brief=1
run python_cuda 300 env PYTHONPATH="$bundle/python:$bundle/tests/python" \
    MATMUL_SERVER_BINARY="$bundle/bin/matmul-server" MATMUL_TEST_BACKEND=cuda \
    python3 -m unittest -v test_matmul_client
run service_bench 420 bash "$here/service_bench.sh" "$bundle/bin" "$out" "$mode"
grep -hE 'Failure|Expected|Which is|Error|error' "$out/gpu_server_test.log" "$out/python_cuda.log" | head -30
grep -vE '^#' "$out/service_bench.log" | head -80
printf '%s\n' "${summary[@]}"
