#!/usr/bin/env bash
# A/B of two gemm-bench builds in one run on a machine with an NVIDIA GPU:
# the rows given, for each build in turn, ROUNDS times (alternating, so that
# clock and temperature drift fall on both), back-to-back timing. The base
# build is usually main's gemm-bench from before a change (build it from a
# git worktree of the base commit and carry it beside the new one).
#
#   tests/gpu/ab_kernels.sh NEW_BENCH BASE_BENCH OUT_DIR [ROUNDS] [gemm-bench args...]
#
# Default args: bf16 2048^3, 4096^3, 8192^3, 4096x4096x8192 and the three
# grouped batches, --quick. JSON per run goes to OUT_DIR; a table of the
# median microseconds per row and build is printed last (cuBLAS rows come
# from both builds' runs). NEW_FLAGS and BASE_FLAGS add arguments to one
# side only, so that one build can be compared with itself under two
# settings (NEW_FLAGS=--edge_tiles=1 BASE_FLAGS=--edge_tiles=0
# ab_kernels.sh BENCH BENCH OUT).
set -uo pipefail
new=$1 base=$2 out=$3 rounds=${4:-2}
shift $(( $# >= 4 ? 4 : 3 ))
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--quick --dtype=bfloat16 --size=2048^3 --size=4096^3 --size=8192^3
        --size=4096x4096x8192 --size=256 --size=1024 --size=64)
fi
mkdir -p "$out"
lib=$(dirname "$new")/../lib
[[ -d $lib ]] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for ((r = 1; r <= rounds; ++r)); do
  for v in new base; do
    bin=$new flags=${NEW_FLAGS:-}
    [[ $v == base ]] && bin=$base flags=${BASE_FLAGS:-}
    # shellcheck disable=SC2086
    timeout 300 "$bin" --timing=back-to-back "${args[@]}" $flags --json="$out/${v}_$r.json" \
      >"$out/${v}_$r.log" 2>&1
    echo "round $r $v rc=$?"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for v in ("new", "base"):
    for r in range(1, rounds + 1):
        try:
            data = json.load(open(f"{out}/{v}_{r}.json"))
        except (OSError, ValueError):
            continue
        for row in data["rows"]:
            key = (row["group"], row["name"], row["dtype"], row["variant"])
            rows.setdefault(key, {}).setdefault(v, []).append(row["us"])
print(f"{'problem':<24} {'variant':<40} {'base us':>10} {'new us':>10} {'change':>8}")
for (group, name, dtype, variant), by in rows.items():
    b = statistics.median(by["base"]) if "base" in by else float("nan")
    n = statistics.median(by["new"]) if "new" in by else float("nan")
    change = f"{100 * (n / b - 1):+.1f}%" if b == b and n == n and b > 0 else "-"
    print(f"{name:<24} {variant[:40]:<40} {b:>10.1f} {n:>10.1f} {change:>8}")
PY
