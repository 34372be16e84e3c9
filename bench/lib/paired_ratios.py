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

A median below the target is FAIL only when the rounds show it: an exact
one-sided Wilcoxon signed-rank test on log(ratio / target) (the paired
counterpart of plot_ratios.py's Mann-Whitney U) at p < 0.05; otherwise it
is "noise". Five rounds can reach p < 0.05 only when every one is below.
"""

import argparse
import collections
import itertools
import math
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


def signed_rank_p_below(ratios, target):
    """Exact one-sided p-value of the Wilcoxon signed-rank test that the
    ratios lie below `target`: the share of the 2^n sign assignments of the
    ranked |log(ratio / target)| whose positive rank sum is at most the
    observed one. Rounds exactly at the target are dropped; tied magnitudes
    share their average rank. Exact up to 20 rounds, the normal
    approximation (with continuity correction) beyond.
    (`python3 -m doctest bench/lib/paired_ratios.py` runs these.)

    >>> signed_rank_p_below([0.9] * 5, 1.0)  # all five below: 1 in 32
    0.03125
    >>> signed_rank_p_below([0.72, 0.8, 0.85, 0.9, 1.05], 1.0)
    0.0625
    >>> signed_rank_p_below([1.1, 1.2, 1.3], 1.0)
    1.0
    """
    d = [math.log(r / target) for r in ratios if r != target]
    if not d:
        return 1.0
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    rank = [0.0] * len(d)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            rank[order[k]] = (i + j) / 2 + 1
        i = j + 1
    observed = sum(r for r, x in zip(rank, d) if x > 0)
    n = len(d)
    if n > 20:
        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return 0.5 * math.erfc(-((observed + 0.5 - mean) / sd) / math.sqrt(2))
    at_most = sum(
        sum(r for r, up in zip(rank, signs) if up) <= observed + 1e-9
        for signs in itertools.product((False, True), repeat=len(d))
    )
    return at_most / 2 ** len(d)


def verdict(ratios, target):
    """PASS, FAIL (the shortfall shows in the rounds) or noise (it does not)."""
    if statistics.median(ratios) >= target:
        return "PASS"
    return "FAIL" if signed_rank_p_below(ratios, target) < 0.05 else "noise"


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
        print(f"{phase:18} rounds {len(rs):2}  median {m:.2f}  (min {min(rs):.2f}, max {max(rs):.2f})"
              f"  target >= {a.target:.2f}  {verdict(rs, a.target)}")
    print("(FAIL: below the target at p < 0.05, one-sided Wilcoxon signed-rank test over the paired rounds; "
          "noise: below it by median only)")


if __name__ == "__main__":
    main()
