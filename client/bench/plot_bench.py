#!/usr/bin/python3
"""Draws matmul-bench JSON lines as a PNG of latency against throughput: one
curve per (label, target, mode, shape, dtype), points in order of
concurrency (or rate), p50 solid and p99 dashed.

    /usr/bin/python3 client/bench/plot_bench.py bench.jsonl out.png [shape [dtype]]
"""
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out, shape=None, dtype=None):
    curves = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if (shape and row["shape"] != shape) or (dtype and row["dtype"] != dtype):
                continue
            key = (row["label"], row["target"], row["mode"], row["shape"], row["dtype"])
            curves[key].append(row)
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, rows in sorted(curves.items()):
        rows.sort(key=lambda r: (r["concurrency"], r["rate"]))
        label = " ".join(k for k in key if k)
        line, = ax.plot([r["rps"] for r in rows], [r["p50_ms"] for r in rows], "o-", label=label,
                        markersize=3)
        ax.plot([r["rps"] for r in rows], [r["p99_ms"] for r in rows], "--",
                color=line.get_color(), linewidth=0.8)
    ax.set_xlabel("requests/s")
    ax.set_ylabel("latency, ms (p50 solid, p99 dashed)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    ax.set_title("matmul-bench: latency against throughput, points at rising concurrency"
                 + (f" ({shape} {dtype or ''})" if shape else ""))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
