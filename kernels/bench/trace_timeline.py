#!/usr/bin/env python3
"""Reads a Hopper kernel timeline (gemm-bench-diag with MATMUL_HOPPER_TRACE=FILE,
hopper_gemm.cu's TraceRecord says what a record holds) and prints where a
launch's time went: per consumer tile the wait for its first stage, the main
loop, the split reduction and the epilogue; per loader tile the wait for its
TileInfo and for a free stage; and how the SMs' finishing times spread.

  trace_timeline.py TRACE_FILE [TRACE_FILE...]

Plain Python, no packages needed.
"""
import statistics
import sys


def load(path):
    header, rows = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                words = line[1:].split()
                header = {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}
                continue
            v = [int(x) for x in line.split()]
            if len(v) != 8:
                continue
            rows.append({
                "kind": v[0] >> 56, "wg": (v[0] >> 48) & 0xFF, "sm": (v[0] >> 32) & 0xFFFF,
                "tile": v[0] & 0xFFFFFFFF, "problem": v[1] >> 32, "kblocks": (v[1] >> 16) & 0xFFFF,
                "unit": v[1] & 0xFFFF, "ns": v[2], "t": v[3:8]})
    return header, rows


def calibrate(rows):
    """Per SM: clock cycles -> global ns. The global timer ticks in steps of
    tens of ns or more, so one clock rate (ns per cycle) is fitted from the
    SMs whose records span the longest time, and each SM's offset from its
    first record."""
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r["sm"], []).append((r["t"][0], r["ns"]))
    rates, firsts = [], {}
    for sm, pairs in by_sm.items():
        pairs.sort()
        (c0, g0), (c1, g1) = pairs[0], pairs[-1]
        firsts[sm] = (c0, g0)
        if g1 - g0 > 10000:
            rates.append((g1 - g0) / (c1 - c0))
    rate = statistics.median(rates) if rates else 1 / 1.75
    # Relative to the earliest stamp: 64-bit ns do not fit a float's mantissa.
    base = min(g0 for _, g0 in firsts.values())
    return {sm: (c0, g0 - base, rate) for sm, (c0, g0) in firsts.items()}


def report(path):
    header, rows = load(path)
    print(f"== {path}: {' '.join(f'{k}={v}' for k, v in header.items())}")
    if not rows:
        print("no records")
        return
    fits = calibrate(rows)

    def ns(r, i):
        c0, g0, rate = fits[r["sm"]]
        return g0 + (r["t"][i] - c0) * rate

    cons = [r for r in rows if r["kind"] == 0]
    load_rows = [r for r in rows if r["kind"] == 1]
    start = min(ns(r, 0) for r in rows)
    end = max(ns(r, 4) for r in cons) if cons else max(ns(r, 4) for r in rows)
    print(f"launch span (first record to last epilogue): {(end - start) / 1e3:.2f} us; "
          f"clock {1 / statistics.median(f[2] for f in fits.values()):.3f} GHz (median SM)")
    print("consumer phases, us (median / mean / max) by split unit (0: whole tile):")
    print(f"  {'unit':>4} {'n':>5} {'kb':>5} {'wait first':>26} {'main loop':>26} "
          f"{'main/kb':>8} {'reduce':>26} {'epilogue':>26}")
    for unit in sorted({r["unit"] for r in cons}):
        sel = [r for r in cons if r["unit"] == unit]
        phase = lambda a, b: [(ns(r, b) - ns(r, a)) / 1e3 for r in sel]
        cols = []
        for a, b in ((0, 1), (1, 2), (2, 3), (3, 4)):
            v = phase(a, b)
            cols.append(f"{statistics.median(v):8.2f} {statistics.mean(v):8.2f} {max(v):8.2f}")
        per_kb = statistics.median((ns(r, 2) - ns(r, 1)) / 1e3 / max(r["kblocks"], 1) for r in sel)
        kb = statistics.median(r["kblocks"] for r in sel)
        print(f"  {unit:>4} {len(sel):>5} {kb:>5} {cols[0]:>26} {cols[1]:>26} {per_kb:8.3f} "
              f"{cols[2]:>26} {cols[3]:>26}")
    # When each unit kind ran, relative to the launch's first record.
    print("when (us from start; median start of wait / first stage / end):")
    for unit in sorted({r["unit"] for r in cons}):
        sel = [r for r in cons if r["unit"] == unit]
        print(f"  unit {unit}: " + " / ".join(
            f"{statistics.median((ns(r, i) - start) / 1e3 for r in sel):.2f}" for i in (0, 1, 4)) +
            f"   (last end {max((ns(r, 4) - start) / 1e3 for r in sel):.2f})")
    if load_rows:
        print("loader, us (median / mean / max): wait for TileInfo, then for the first free stage,"
              " then issuing the tile")
        for a, b, name in ((0, 1, "info"), (1, 2, "first stage"), (2, 3, "issue span")):
            v = [(ns(r, b) - ns(r, a)) / 1e3 for r in load_rows]
            print(f"  {name:>12}: {statistics.median(v):8.2f} {statistics.mean(v):8.2f} {max(v):8.2f}")
    # Spread of SM finishing times: how much of the launch is tail.
    finish = {}
    for r in cons:
        finish[r["sm"]] = max(finish.get(r["sm"], 0), ns(r, 4))
    busy = {}
    for r in cons:
        if r["wg"] == 0:
            busy[r["sm"]] = busy.get(r["sm"], 0) + ns(r, 4) - ns(r, 1)
    f = sorted((v - start) / 1e3 for v in finish.values())
    print(f"SM finish, us: first {f[0]:.2f}, median {statistics.median(f):.2f}, last {f[-1]:.2f}; "
          f"SMs {len(f)}; busy (wg 0, first stage to epilogue end) median "
          f"{statistics.median(busy.values()) / 1e3:.2f} us")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
