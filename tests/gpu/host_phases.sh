#!/usr/bin/env bash
# Where the launcher's host time goes on the grouped batches: one isolated
# gemm-bench run of the three grouped rows, then the launcher's own phases
# (LaunchReport::hopper_plan_us, hopper_build_us, hopper_enqueue_us) beside
# the host time of the whole call, per row. About a minute on an H100/H200.
#
#   tests/gpu/host_phases.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds gemm-bench (and a lib/ beside it when the shared libraries
# travel with it).
set -uo pipefail
bin=$1 out=$2
mkdir -p "$out"
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$bin/gemm-bench" --quick --only=grouped --json="$out/host_phases.json" >"$out/host_phases.log" 2>&1
echo "rc=$? (gemm-bench)"
printf '%-18s %-40s %8s %8s %8s %8s %8s\n' batch variant us host plan build enqueue
# One row per line in the JSON: pick the fields of our grouped rows.
grep '"group": "grouped"' "$out/host_phases.json" | grep '"variant": "ours' |
  sed -E 's/.*"name": "([^"]*)".*"variant": "([^"(]*).*"us": ([0-9.]+).*"host_us": ([0-9.]+), "host_plan_us": ([0-9.]+), "host_build_us": ([0-9.]+), "host_enqueue_us": ([0-9.]+).*/\1|\2|\3|\4|\5|\6|\7/' |
  while IFS='|' read -r name variant us host plan build enqueue; do
    printf '%-18s %-40s %8s %8s %8s %8s %8s\n' "$name" "$variant" "$us" "$host" "$plan" "$build" "$enqueue"
  done
