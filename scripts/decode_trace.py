#!/usr/bin/env python3
"""Reads the block records of one traced decode step (bitnet bench e2e with
BITNET_DECODE_TRACE=FILE, built with -DBITNET_DECODE_TRACE=ON) and prints,
per kernel of the chain and averaged over the layers:

  chain   time from the previous kernel's inputs being ready (its first block
          past pdl_wait) to this kernel's: what the previous stage costs the
          step, its work after the wait plus the hand-over
  early   when this kernel's first block ran, against the previous kernel's
          ready time (negative: it was resident and prefetching before)
  late    the last block's start against this kernel's own ready time
          (positive: those blocks ran only after the inputs were ready, so
          they prefetched nothing before the wait)
  spread  last block past the wait minus the first
  m0..m3  the latest block at each point pdl_mark(k) of the kernel, against
          its ready time (- where the kernel has no such point)
  hand    the next kernel's ready time against this kernel's latest mark:
          completion and hand-over, after the last marked point

usage: decode_trace.py TRACE.csv
"""
import csv
import sys


def kernels(rows):
    rows.sort(key=lambda r: r["t_run_ns"])
    out, i = [], 0
    while i < len(rows):
        g, t = rows[i]["grid"], rows[i]["threads"]
        blk = rows[i:i + g]
        if len(blk) < g or any(r["grid"] != g or r["threads"] != t for r in blk):
            # Not whole grids in run order: cut at the next change instead.
            j = i
            while j < len(rows) and rows[j]["grid"] == g and rows[j]["threads"] == t:
                j += 1
            blk = rows[i:j]
        out.append({
            "grid": g, "threads": t, "blocks": len(blk),
            "run0": min(r["t_run_ns"] for r in blk), "run1": max(r["t_run_ns"] for r in blk),
            "rdy0": min(r["t_ready_ns"] for r in blk), "rdy1": max(r["t_ready_ns"] for r in blk),
            "marks": [max((r.get(f"m{j}", 0) for r in blk), default=0) for j in range(4)],
        })
        i += len(blk)
    return out


def period(ks):
    sig = [(k["grid"], k["threads"]) for k in ks]
    for p in range(2, 16):
        reps = [sig[i:i + p] for i in range(1, len(sig) - p + 1, p)]
        if len(reps) >= 3 and all(r == reps[0] for r in reps[:-1]):
            return p
    return 0


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        sys.exit("no records")
    stamps = sorted({r["t_run_ns"] for r in rows} | {r["t_ready_ns"] for r in rows})
    steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    print(f"{len(rows)} block records; timer steps seen: smallest {min(steps) if steps else 0} ns")
    ks = kernels(rows)
    for a, b in zip(ks, ks[1:]):
        b["chain"] = (b["rdy0"] - a["rdy0"]) / 1e3
        b["early"] = (b["run0"] - a["rdy0"]) / 1e3
    for k in ks:
        k["late"] = (k["run1"] - k["rdy0"]) / 1e3
        k["spread"] = (k["rdy1"] - k["rdy0"]) / 1e3
        k["m"] = [(m - k["rdy0"]) / 1e3 if m else None for m in k["marks"]]
    for a, b in zip(ks, ks[1:]):
        last = max(m for m in a["marks"]) if any(a["marks"]) else 0
        a["hand"] = (b["rdy0"] - last) / 1e3 if last else None
    first, last = ks[0]["rdy0"], ks[-1]["rdy0"]
    print(f"{len(ks)} kernels traced; first ready to last ready {(last - first) / 1e3:.1f} us")
    p = period(ks)
    print(f"per-layer pattern: {p} kernels" if p else "no per-layer pattern found")
    print("\nkernels in order (chain: the previous kernel's cost to the step)")
    print(f"{'#':>4} {'grid':>6} {'thr':>5} {'chain':>7} {'early':>7} {'late':>7} {'spread':>7}")
    for i, k in enumerate(ks[:2 * p + 2] if p else ks):
        print(f"{i:>4} {k['grid']:>6} {k['threads']:>5} {k.get('chain', 0):7.2f} "
              f"{k.get('early', 0):7.2f} {k['late']:7.2f} {k['spread']:7.2f}")
    if p:
        print(f"\naveraged over the layers (position in the layer's {p} kernels; chain is the "
              "cost of the kernel BEFORE this one; m0..m3 and hand are this kernel's)")
        print(f"{'pos':>4} {'grid':>6} {'thr':>5} {'chain':>7} {'early':>7} {'late':>7} "
              f"{'spread':>7} {'m0':>6} {'m1':>6} {'m2':>6} {'m3':>6} {'hand':>6}")
        for j in range(p):
            sel = [k for i, k in enumerate(ks) if i >= 1 and (i - 1) % p == j and "chain" in k]
            if not sel:
                continue
            avg = lambda key: sum(k[key] for k in sel) / len(sel)

            def avg_opt(get):
                vals = [get(k) for k in sel if get(k) is not None]
                return f"{sum(vals) / len(vals):6.2f}" if vals else f"{'-':>6}"
            marks = " ".join(avg_opt(lambda k, q=q: k["m"][q]) for q in range(4))
            print(f"{j:>4} {sel[0]['grid']:>6} {sel[0]['threads']:>5} {avg('chain'):7.2f} "
                  f"{avg('early'):7.2f} {avg('late'):7.2f} {avg('spread'):7.2f} {marks} "
                  f"{avg_opt(lambda k: k.get('hand'))}")

if __name__ == "__main__":
    main()
