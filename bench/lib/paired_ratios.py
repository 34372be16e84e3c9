#!/usr/bin/env python3
"""bench/lib/paired_ratios.py — per-round paired ratios of two systems, pooled over runs.

  python3 bench/lib/paired_ratios.py RUN.tsv [RUN.tsv ...] [--ref oubli] [--judge oubli-infer] [--target 0.93]

plot_ratios.py divides the median of each system's rounds. On a shared
machine the load drifts during a run, and the two medians can come from
different moments; here each round's pair (the two systems ran back to
back, in bench/nbd's rotating order) gives one ratio, and the median is
taken over every round of every run given (runs of the same revision).
Ratios are judge/ref for higher-is-better phases and ref/judge for times,
so > 1 means the judged system was faster.
"""

import argparse
import collections
import statistics


def rounds(path):
    """(system, phase) -> [(value, better)] in file order (= round order)."""
    occ = collections.defaultdict(list)
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        system, phase, value, _unit, better = line.rstrip("\n").split("\t")[:5]
        occ[(system, phase)].append((float(value), better))
    return occ


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tsv", nargs="+")
    ap.add_argument("--ref", default="oubli")
    ap.add_argument("--judge", default="oubli-infer")
    ap.add_argument("--target", type=float, default=0.93)
    a = ap.parse_args()
    pooled = collections.defaultdict(list)
    order = []
    for path in a.tsv:
        occ = rounds(path)
        for (system, phase), values in occ.items():
            if system != a.judge:
                continue
            if phase not in order:
                order.append(phase)
            for (v, better), (r, _) in zip(values, occ[(a.ref, phase)]):
                pooled[phase].append(v / r if better == "higher" else r / v)
    for phase in order:
        rs = pooled[phase]
        m = statistics.median(rs)
        verdict = "PASS" if m >= a.target else "FAIL"
        print(f"{phase:18} rounds {len(rs):2}  median {m:.2f}  (min {min(rs):.2f}, max {max(rs):.2f})"
              f"  target >= {a.target:.2f}  {verdict}")


if __name__ == "__main__":
    main()
