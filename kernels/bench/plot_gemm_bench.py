#!/usr/bin/python3
"""Draws gemm-bench JSON as PNGs: TFLOP/s against size per dtype (persistent,
one CTA per tile, cuBLAS), and microseconds per grouped batch.

    /usr/bin/python3 kernels/bench/plot_gemm_bench.py docs/bench/gemm_bench_DATE.json docs/
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = ["1024^3", "2048^3", "4096^3", "8192^3", "4096x11008x4096"]
VARIANTS = [("ours persistent", "o-"), ("ours one CTA/tile", "s--"), ("cuBLAS", "^:")]


def main(path, out_dir):
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    dtypes = [d for d in ("bfloat16", "float16", "tf32", "float32")
              if any(r["dtype"] == d and r["group"] == "single" for r in rows)]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.2 * len(dtypes), 3.8), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        for variant, style in VARIANTS:
            ys = []
            for size in SIZES:
                match = [r for r in rows if r["group"] == "single" and r["dtype"] == dtype
                         and r["name"] == size and r["variant"] == variant]
                ys.append(match[0]["tflops"] if match else float("nan"))
            ax.plot(range(len(SIZES)), ys, style, label=variant)
        ax.set_title(dtype)
        ax.set_xticks(range(len(SIZES)))
        ax.set_xticklabels([s.replace("x11008x", "x11008\nx") for s in SIZES], fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Single GEMMs on {data['gpu']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "gemm_single.png"), dpi=110)

    grouped = [r for r in rows if r["group"] == "grouped"]
    batches = sorted({r["name"] for r in grouped}, key=lambda n: [r["name"] for r in grouped].index(n))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = ["ours persistent", "ours one CTA/tile", "cublasGemmGroupedBatchedEx",
              "cuBLAS per problem"]
    width = 0.2
    for i, label in enumerate(labels):
        ys = []
        for b in batches:
            match = [r for r in grouped if r["name"] == b and r["variant"].startswith(label)]
            ys.append(match[0]["us"] if match else 0)
        ax.bar([x + (i - 1.5) * width for x in range(len(batches))], ys, width, label=label)
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([f"bf16 {b}" for b in batches])
    ax.set_ylabel("microseconds per batch (lower is better)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Grouped batches on {data['gpu']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "gemm_grouped.png"), dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
