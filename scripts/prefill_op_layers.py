#!/usr/bin/env python3
"""Per-layer view of a prefill op profile (KILN_CUDA_OP_TIMING=2 kiln bench ... 2> log).

The profile lists every op of one pass in order ("op N name us"). Layers do not all have the
same ops (a Q4_K_M layer with a q4_K v runs q/k/v as one matmul_parts, one with a q6_K v as
three matmuls), so this sums each op name over layers 1 .. n-2 (from the second attention op
to the last) and divides by their number: per layer, the mean time of each op name and how
many of it run.

  python3 scripts/prefill_op_layers.py profile.log [more.log ...]
"""
import re
import sys


def main():
    for path in sys.argv[1:]:
        ops = []
        for line in open(path, errors="replace"):
            m = re.match(r"\s*op\s+(\d+)\s+(\S+)\s+([0-9.]+) us", line)
            if m:
                ops.append((m.group(2), float(m.group(3))))
        starts = [i for i, (name, _) in enumerate(ops) if name == "attention"]
        total = sum(us for _, us in ops)
        print(f"== {path}: {len(ops)} ops, {total:.1f} us in all, {len(starts)} layers")
        if len(starts) < 3:
            continue
        # From the second layer's attention to the last one's: whole layers, without the first
        # (first-use costs: the products' algorithm timing) and the output head.
        window = ops[starts[1]:starts[-1]]
        layers = len(starts) - 2
        by_name = {}
        for name, us in window:
            t, n = by_name.get(name, (0.0, 0))
            by_name[name] = (t + us, n + 1)
        for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
            print(f"  {name:22s} {t / layers:8.2f} us per layer  ({n / layers:.2f} per layer, {t / n:.2f} us each)")
        print(f"  {'layer':22s} {sum(t for t, _ in by_name.values()) / layers:8.2f} us (layers 1 .. {len(starts) - 2})")


if __name__ == "__main__":
    main()
