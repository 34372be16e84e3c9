#!/usr/bin/env python3
"""bench/nand/report.py — the table and plot of bench/nand/run.

Reads the JSON lines of oubli-bench-nand (one per purge period) and writes
the table beside DNEFS's Table 2 (txt) and a two-panel plot (png):
erasures per hour and projected lifetime per purge period.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from plot_ratios import matplotlib_or_none  # noqa: E402

# DNEFS (Reardon et al.), Table 2: PEB erasures per hour, wear inequality (%),
# lifetime (years); UBIFSec on a simulated Nexus One data partition.
DNEFS = {
    None: (21.3, 16.6, 841),
    60: (26.4, 17.9, 679),
    30: (34.9, 17.8, 512),
    15: (40.1, 19.0, 447),
    5: (68.5, 19.2, 262),
    1: (158.6, 20.0, 113),
}


def label(minutes):
    return "none" if minutes is None else f"{minutes} min"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--rev", default="unknown")
    ap.add_argument("--txt", required=True)
    ap.add_argument("--png")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.jsonl) if line.startswith("{")]
    if not rows:
        sys.exit("report.py: no results")
    first = rows[0]
    lines = [
        f"bench/nand/run at {a.rev}: {first['blocks']} erase blocks of 128 KiB, "
        f"{first['hours']} simulated hours per purge period after filling; "
        f"lifetime at {first['rated_cycles']} cycles per block",
        "",
        f"{'scheme':<19}{'purge':<8}{'erasures/h':>11}{'commits':>9}{'Hoover %':>10}{'lifetime y':>12}"
        f"{'MiB/h':>8}   | DNEFS: {'erasures/h':>10}{'ineq %':>8}{'years':>7}",
    ]
    for r in rows:
        m = r["purge_minutes"]
        d = DNEFS.get(m)
        ref = f"{d[0]:>10.1f}{d[1]:>8.1f}{d[2]:>7}" if d else f"{'-':>10}{'-':>8}{'-':>7}"
        lines.append(
            f"{r.get('scheme', 'parent-pointer'):<19}{label(m):<8}{r['erases_per_hour']:>11.1f}"
            f"{r['commits']:>9}{r['hoover'] * 100:>10.1f}"
            f"{r['lifetime_years']:>12.0f}{r['written_bytes'] / r['hours'] / 2**20:>8.1f}   |        {ref}"
        )
    lines += [
        "",
        "DNEFS's lifetimes are consistent with 10^5 cycles per block (1571 x 10^5 / 21.3 / 8766 h = 841 years),",
        "not the 10^4 its caption states (which gives 84): compare with --rated-cycles 100000.",
    ]
    text = "\n".join(lines) + "\n"
    with open(a.txt, "w") as f:
        f.write(text)
    plt = matplotlib_or_none() if a.png else None
    if plt is None:
        return
    schemes = list(dict.fromkeys(r.get("scheme", "parent-pointer") for r in rows))
    periods = list(dict.fromkeys(r["purge_minutes"] for r in rows))
    names = [label(m) for m in periods]
    by = {(r.get("scheme", "parent-pointer"), r["purge_minutes"]): r for r in rows}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = list(range(len(periods)))
    width = 0.8 / (len(schemes) + 1)
    for k, scheme in enumerate(schemes):
        at = [x - 0.4 + width * (k + 0.5) for x in xs]
        rs = [by.get((scheme, m)) for m in periods]
        left.bar(at, [r["erases_per_hour"] if r else 0 for r in rs], width, label=scheme)
        right.bar(at, [r["lifetime_years"] if r else 0 for r in rs], width, label=scheme)
    at = [x - 0.4 + width * (len(schemes) + 0.5) for x in xs]
    left.bar(at, [DNEFS.get(m, (0,))[0] for m in periods], width, label="DNEFS Table 2 (UBIFSec)")
    left.set_xticks(xs, names)
    left.set_ylabel("erasures per hour")
    left.set_xlabel("purge period")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    right.set_xticks(xs, names)
    right.set_ylabel(f"projected lifetime, years ({first['rated_cycles']} cycles)")
    right.set_xlabel("purge period")
    fig.suptitle(f"bench/nand at {a.rev}: wear per purge period")
    fig.tight_layout()
    fig.savefig(a.png, dpi=100)


if __name__ == "__main__":
    main()
