#!/usr/bin/env python3
"""Per-layer view of a prefill op profile (KILN_CUDA_OP_TIMING=2 kiln bench ... 2> log).

The profile lists every op of one pass in order ("op N name us"). The layers repeat with the
same ops, so the ops are grouped by their place in the layer (the period is the distance
between two "attention" ops, a window starts at one) and each place's time is averaged over
layers 1 .. n-2 (layer 0 may differ: first-use costs). Prints one line per place: name, mean
us, min, max, and the layer's sum.

  python3 scripts/prefill_op_layers.py profile.log [more.log ...]
"""
import re
import sys


def layer_table(path):
    ops = []
    for line in open(path, errors="replace"):
        m = re.match(r"\s*op\s+(\d+)\s+(\S+)\s+([0-9.]+) us", line)
        if m:
            ops.append((m.group(2), float(m.group(3))))
    starts = [i for i, (name, _) in enumerate(ops) if name == "attention"]
    if len(starts) < 3:
        return None, ops
    # Windows from one layer's attention to the next one's: every op of a layer once (the
    # ops before attention are the next layer's), layers 1 .. n-2.
    period = starts[2] - starts[1]
    places = {}
    for layer in range(1, len(starts) - 1):
        for off in range(period):
            places.setdefault(off, []).append(ops[starts[layer] + off])
    return places, ops


def main():
    for path in sys.argv[1:]:
        places, ops = layer_table(path)
        total = sum(us for _, us in ops)
        print(f"== {path}: {len(ops)} ops, {total:.1f} us in all")
        if places is None:
            print("  (fewer than three attention ops: no layer view)")
            continue
        layer_sum = 0.0
        for off in sorted(places):
            entries = places[off]
            names = {n for n, _ in entries}
            times = [us for _, us in entries]
            mean = sum(times) / len(times)
            layer_sum += mean
            print(f"  {'/'.join(sorted(names)):24s} {mean:8.2f} us  (min {min(times):.2f}, max {max(times):.2f}, "
                  f"{len(times)} layers)")
        print(f"  layer: {layer_sum:.1f} us")


if __name__ == "__main__":
    main()
