#!/usr/bin/env python3
"""Reads a per-block wait trace (KILN_CUDA_BLOCK_TRACE_FILE from a build configured with
-DKILN_CUDA_BLOCK_TRACE=ON; backend/cuda/block_trace.cuh) and prints, for each kernel of the last
decode steps, when its blocks were released (its predecessors done) and how early they had
arrived; then, per kernel shape, the medians over the trace.

  KILN_CUDA_BLOCK_TRACE_FILE=t.csv kiln bench -m m.gguf -p 0 -n 32 -r 1 --device cuda
  scripts/block-trace-summary.py t.csv [--last N]

Kernels are told apart by their release: the blocks that waited were all released together when
the kernel before completed (within `--gap` us), so each such cluster is one kernel; a block
that arrived after its kernel's release (it did not wait) belongs to the latest cluster released
before it arrived with the same shape (grid, block size, dynamic shared memory), if that release
is at most `--max-late` us earlier. The other blocks that did not wait are kernels none of whose
blocks waited (they arrived once the kernel before had completed, e.g. after a kernel of a few
blocks): consecutive arrivals of one shape, at most `--arrival-gap` us apart, are one kernel,
"released" at its first block's arrival, with `waited` 0%.

Columns: `chain us`: this kernel's release to the next one's, i.e. this kernel's time in the
chain after its inputs were ready; `early us`: how long before its release its first block
arrived (room found beside the kernel before); `waited`: the share of its blocks that arrived
before the release; `late us`: the last block's arrival after the release (blocks that only
found room once the kernel before left).

Phase stamps (trace_stamp in backend/cuda/common.cuh), thread 0's times after its wait: 0 once it
has also let the next kernel start (every kernel that calls begin_chained_kernel, and the grouped
products); 1 the expert id read (the tiled MoE gate / up); 2 the activations staged and the first
weights in (tiled MoE, grouped products); 3 its result written. A second table gives, per kernel
shape and stamp, the median block's and the last block's time after the kernel's release
(medians over the trace). A third gives each block's own view: how long after the kernel's
release its wait returned (the release reaching the blocks one after another), then each stamp
after that return, so that a phase's time is told apart from the spread of the release."""
import argparse
import csv
import statistics
import sys

STAMPS = 4


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    recs = []
    for r in rows:
        recs.append({
            "arrived": int(r["arrived_ns"]), "released": int(r["released_ns"]),
            "stamps": [int(r.get(f"stamp{k}_ns", 0) or 0) for k in range(STAMPS)],
            "shape": (int(r["blocks"]), int(r["threads"]), int(r["dynamic_smem"])),
        })
    return recs


def kernels(recs, gap_ns, min_wait_ns, max_late_ns, arrival_gap_ns):
    waited = sorted((r for r in recs if r["released"] - r["arrived"] >= min_wait_ns), key=lambda r: r["released"])
    clusters = []
    for r in waited:
        c = clusters[-1] if clusters else None
        if c and r["released"] - c["release"] <= gap_ns and r["shape"] == c["shape"]:
            c["blocks"].append(r)
        else:
            clusters.append({"release": r["released"], "shape": r["shape"], "blocks": [r]})
    releases = [c["release"] for c in clusters]
    import bisect
    unattached = []
    for r in sorted((r for r in recs if r["released"] - r["arrived"] < min_wait_ns), key=lambda r: r["arrived"]):
        # A kernel released just after the block arrived (a block released within --min-wait of
        # its arrival counts as not waiting), else the latest one released before it.
        j = bisect.bisect_right(releases, r["arrived"])
        while j < len(clusters) and clusters[j]["release"] - r["arrived"] <= gap_ns and clusters[j]["shape"] != r["shape"]:
            j += 1
        if j < len(clusters) and clusters[j]["release"] - r["arrived"] <= gap_ns:
            clusters[j].setdefault("late", []).append(r)
            continue
        i = j - 1 if j <= len(clusters) else len(clusters) - 1
        i = min(i, bisect.bisect_right(releases, r["arrived"]) - 1)
        while i >= 0 and clusters[i]["shape"] != r["shape"] and r["arrived"] - clusters[i]["release"] <= max_late_ns:
            i -= 1
        if i >= 0 and clusters[i]["shape"] == r["shape"] and r["arrived"] - clusters[i]["release"] <= max_late_ns:
            clusters[i].setdefault("late", []).append(r)
        else:
            unattached.append(r)
    open_by_shape = {}  # the latest unwaited kernel of each shape
    for r in unattached:
        c = open_by_shape.get(r["shape"])
        if c and r["arrived"] - c["last_arrival"] <= arrival_gap_ns:
            c["late"].append(r)
            c["last_arrival"] = r["arrived"]
        else:
            c = {"release": r["arrived"], "shape": r["shape"], "blocks": [], "late": [r], "last_arrival": r["arrived"]}
            open_by_shape[r["shape"]] = c
            clusters.append(c)
    clusters.sort(key=lambda c: c["release"])
    return clusters


def describe(shape):
    blocks, threads, smem = shape
    return f"{blocks}x{threads} {smem // 1024}K"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, default=40, help="kernels listed one by one (the last ones)")
    ap.add_argument("--gap", type=float, default=0.5, help="us: releases closer than this are one kernel's")
    ap.add_argument("--min-wait", type=float, default=0.1, help="us: a block waited if released this much later")
    ap.add_argument("--max-late", type=float, default=30.0,
                    help="us: a block that did not wait joins a kernel released at most this much earlier")
    ap.add_argument("--arrival-gap", type=float, default=2.0,
                    help="us: blocks of a kernel none of whose blocks waited arrive at most this far apart")
    a = ap.parse_args()
    recs = load(a.trace)
    if not recs:
        sys.exit("no records")
    ks = kernels(recs, int(a.gap * 1000), int(a.min_wait * 1000), int(a.max_late * 1000), int(a.arrival_gap * 1000))
    rows = []
    for i, k in enumerate(ks[:-1]):
        blocks = k["blocks"] + k.get("late", [])
        chain = (ks[i + 1]["release"] - k["release"]) / 1000
        early = (k["release"] - min(b["arrived"] for b in blocks)) / 1000
        late = max(0, max(b["arrived"] for b in blocks) - k["release"]) / 1000
        rows.append((k["shape"], chain, early, len(k["blocks"]) / len(blocks), late))
    print(f"{len(recs)} records, {len(ks)} kernels")
    print(f"{'kernel shape':>22} {'chain us':>9} {'early us':>9} {'waited':>7} {'late us':>8}")
    for shape, chain, early, share, late in rows[-a.last:]:
        print(f"{describe(shape):>22} {chain:9.2f} {early:9.2f} {share:7.0%} {late:8.2f}")
    print("\nmedians per kernel shape")
    print(f"{'kernel shape':>22} {'n':>5} {'chain us':>9} {'early us':>9} {'waited':>7} {'late us':>8}")
    by = {}
    for r in rows:
        by.setdefault(r[0], []).append(r)
    for shape, rs in sorted(by.items(), key=lambda kv: -sum(r[1] for r in kv[1])):
        med = [statistics.median(r[j] for r in rs) for j in (1, 2, 3, 4)]
        print(f"{describe(shape):>22} {len(rs):5d} {med[0]:9.2f} {med[1]:9.2f} {med[2]:7.0%} {med[3]:8.2f}")
    print_stamps(ks)
    print_stamps_own(ks)


def median_and_last(values):
    """(median, largest) of a list of block times, None for an empty one."""
    return (statistics.median(values), max(values)) if values else None


def print_pairs_table(title, columns, by):
    """Rows of (median block, last block) cells per kernel shape, each cell the medians over the
    kernels of that shape that have it."""
    print(f"\n{title}")
    print(f"{'kernel shape':>22} {'n':>5} " + " ".join(f"{c:>15}" for c in columns))
    for shape, rows in by.items():
        cells = []
        for j in range(len(columns)):
            have = [r[j] for r in rows if r[j]]
            cells.append(f"{statistics.median(m for m, _ in have):7.2f} /{statistics.median(l for _, l in have):6.2f}"
                         if have else f"{'-':>15}")
        print(f"{describe(shape):>22} {len(rows):5d} " + " ".join(f"{c:>15}" for c in cells))


STAMP_COLUMNS = [f"stamp {j}" for j in range(STAMPS)]


def print_stamps(ks):
    """Per kernel shape with phase stamps: each stamp's median block and last block, us after the
    kernel's release (medians over the kernels of that shape)."""
    by = {}
    for k in ks:
        blocks = k["blocks"] + k.get("late", [])
        row = [median_and_last([(b["stamps"][j] - k["release"]) / 1000 for b in blocks if b["stamps"][j]])
               for j in range(STAMPS)]
        if any(row):
            by.setdefault(k["shape"], []).append(row)
    if by:
        print_pairs_table("phase stamps, us after the release: median block / last block", STAMP_COLUMNS, by)


def print_stamps_own(ks):
    """Per kernel shape with phase stamps: the median and last block's own release (its wait's
    return) after the kernel's, then each stamp after the block's own release (blocks that did not
    wait: after their arrival), median block / last block, medians over the kernels."""
    by = {}
    for k in ks:
        blocks = k["blocks"] + k.get("late", [])
        if not any(any(b["stamps"]) for b in blocks):
            continue
        row = [median_and_last([(b["released"] - k["release"]) / 1000 for b in k["blocks"]])]
        row += [median_and_last([(b["stamps"][j] - max(b["released"], b["arrived"])) / 1000
                                 for b in blocks if b["stamps"][j]]) for j in range(STAMPS)]
        by.setdefault(k["shape"], []).append(row)
    if by:
        print_pairs_table("the blocks' own view, us: own release after the kernel's; stamps after the own release",
                          ["own release"] + STAMP_COLUMNS, by)

if __name__ == "__main__":
    main()
