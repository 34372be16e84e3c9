#!/usr/bin/env python3
"""Ratios of every system to a reference system, per phase: a table and a PNG.

    plot_ratios.py TSV --ref gocryptfs [--png out.png] [--txt out.txt]
                   [--judge oubli] [--target 'seq*,rand*=1.0' ...] [--title T]

TSV: one measurement per line, tab-separated, columns

    system  phase  value  unit  better

where better is "higher" (throughput: MB/s, IOPS) or "lower" (times).
Lines starting with '#' are comments and are copied to the top of the
table (put the date, revision and load there). A (system, phase) may
appear several times (rounds): the median is used and the spread (min-max)
is shown. Phases and systems keep their order of first appearance; the
reference's column comes first.

The ratio is always "> 1 means better than the reference":
system/reference for "higher", reference/system for "lower".

--target PATTERNS=MIN (repeatable; PATTERNS is a comma-separated list of
fnmatch patterns on the phase name; the first matching --target applies)
marks the phase's target ratio on the chart, and the table gives a verdict
for each --judge system (default: every system except the reference):
PASS when the median ratio meets the target; FAIL when it does not and the
rounds show it (an exact one-sided rank test, Mann-Whitney U, finds the
system's rounds, scaled by the target, worse than the reference's at
p < 0.05); "noise" when the median misses but the rounds cannot tell the two
apart (the rounds interleave: on a shared machine, a phase of 0.1 s that
asks the device for a handful of requests is a tie). With 3 rounds only
complete separation is significant (p = 0.05); 5 rounds resolve more.

Standard library only, plus matplotlib for the chart (installed with pip
on first use if missing; without it the table is still printed).
Used by bench/fs/run (reference gocryptfs) and bench/nbd/run.
"""

import argparse
import fnmatch
import os
import statistics
import subprocess
import sys


def load(path):
    comments, rows = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.startswith("#"):
                comments.append(line[1:].strip())
                continue
            cols = line.split("\t")
            if len(cols) != 5 or cols[4] not in ("higher", "lower"):
                sys.exit(f"{path}:{n}: want 'system<TAB>phase<TAB>value<TAB>unit<TAB>higher|lower', got {line!r}")
            system, phase, value, unit, better = cols
            rows.append((system, phase, float(value), unit, better))
    return comments, rows


def parse_targets(specs):
    targets = []
    for spec in specs or []:
        pats, _, val = spec.rpartition("=")
        if not pats:
            sys.exit(f"--target {spec!r}: want PATTERNS=MIN")
        targets.append(([p.strip() for p in pats.split(",") if p.strip()], float(val)))
    return targets


def target_for(phase, targets):
    for pats, val in targets:
        if any(fnmatch.fnmatchcase(phase, p) for p in pats):
            return val
    return None


def fmt(x):
    if x is None:
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def summarize(rows, ref):
    systems, phases = [], []
    samples, unit, better = {}, {}, {}
    for system, phase, value, u, b in rows:
        if system not in systems:
            systems.append(system)
        if phase not in phases:
            phases.append(phase)
        samples.setdefault((system, phase), []).append(value)
        if unit.setdefault(phase, u) != u or better.setdefault(phase, b) != b:
            sys.exit(f"phase {phase}: unit/better differ between lines")
    if ref not in systems:
        sys.exit(f"reference system {ref!r} not in the data (systems: {', '.join(systems)})")
    systems.remove(ref)
    systems.insert(0, ref)
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = {}
    for phase in phases:
        r = med.get((ref, phase))
        for s in systems:
            v = med.get((s, phase))
            if v is None or r is None or v == 0 or r == 0:
                ratio[s, phase] = None
            elif better[phase] == "higher":
                ratio[s, phase] = v / r
            else:
                ratio[s, phase] = r / v
    return systems, phases, samples, med, ratio, unit, better


def rank_p_worse(system, ref, better):
    """Exact one-sided p-value of the Mann-Whitney U test that `system`'s
    samples are worse than `ref`'s (lower when higher is better): the share
    of the ways to split the pooled rounds in two whose U is at most the
    observed one. Ties count one half. Small samples only (rounds)."""
    import itertools

    def u(xs, ys):  # pairs where x is better than y, ties as halves
        sign = 1 if better == "higher" else -1
        return sum((sign * (x - y) > 0) + 0.5 * (x == y) for x in xs for y in ys)

    pooled, n = system + ref, len(system)
    observed = u(system, ref)
    splits = list(itertools.combinations(range(len(pooled)), n))
    at_most = 0
    for pick in splits:
        chosen = set(pick)
        xs = [pooled[i] for i in pick]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        at_most += u(xs, ys) <= observed
    return at_most / len(splits)


def verdict_for(ratio, t, system_samples, ref_samples, better):
    """PASS, FAIL (the shortfall shows in the rounds) or noise (it does not)."""
    if ratio >= t:
        return "PASS"
    # Scale the system's rounds by the target, so that the test asks
    # "worse than t times the reference" (t = 0.9: within 10 %).
    scaled = [v / t if better == "higher" else v * t for v in system_samples]
    return "FAIL" if rank_p_worse(scaled, ref_samples, better) < 0.05 else "noise"


def table(comments, systems, phases, samples, med, ratio, unit, better, ref, targets, judge):
    lines = list(comments)
    nrounds = max(len(v) for v in samples.values())
    lines.append(f"median of {nrounds} round(s); (min-max) when the rounds differ; "
                 f"ratio = x / {ref} for higher-is-better, {ref} / x for times, so > 1 is better than {ref}")
    lines.append("")
    w = max(12, max(len(s) for s in systems) + 2)
    head = f"{'phase':<14} {'unit':<5}" + "".join(f"{s:>{w}}" for s in systems)
    lines.append("values")
    lines.append(head)
    lines.append("-" * len(head))
    for p in phases:
        cells = []
        for s in systems:
            v = samples.get((s, p))
            cells.append(fmt(med.get((s, p))) if v else "-")
        lines.append(f"{p:<14} {unit[p]:<5}" + "".join(f"{c:>{w}}" for c in cells))
    lines.append("")
    lines.append("spread (min-max over rounds)")
    lines.append(f"{'phase':<14} {'':<5}" + "".join(f"{s:>{w + 6}}" for s in systems))
    for p in phases:
        cells = []
        for s in systems:
            v = samples.get((s, p))
            cells.append(f"{fmt(min(v))}-{fmt(max(v))}" if v else "-")
        lines.append(f"{p:<14} {'':<5}" + "".join(f"{c:>{w + 6}}" for c in cells))
    lines.append("")
    others = [s for s in systems if s != ref]
    head = f"{'ratio to ' + ref:<20}" + "".join(f"{s:>{w}}" for s in others) + f"{'target':>9}"
    head += "".join(f"{s + ' ok?':>{w + 2}}" for s in judge)
    lines.append(head)
    lines.append("-" * len(head))
    counts = {"PASS": 0, "FAIL": 0, "noise": 0}
    for p in phases:
        t = target_for(p, targets)
        row = f"{p:<20}" + "".join(f"{fmt(ratio[s, p]) + 'x' if ratio[s, p] is not None else '-':>{w}}" for s in others)
        row += f"{('>= ' + fmt(t) + 'x') if t is not None else '':>9}"
        for s in judge:
            r = ratio.get((s, p))
            if t is None or r is None:
                verdict = ""
            else:
                verdict = verdict_for(r, t, samples[s, p], samples[ref, p], better[p])
                counts[verdict] += 1
            row += f"{verdict:>{w + 2}}"
        lines.append(row)
    if targets and judge:
        lines.append("")
        lines.append(f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['noise']} below the target within "
                     f"the rounds' noise ({', '.join(judge)} against the targets; FAIL: p < 0.05, one-sided "
                     f"Mann-Whitney U over the rounds)")
    return "\n".join(lines) + "\n"


def matplotlib_or_none():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib missing: installing it with pip (once) for the chart ...", file=sys.stderr)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"])
        if r.returncode != 0:
            return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def chart(png, title, systems, phases, ratio, ref, targets):
    plt = matplotlib_or_none()
    if plt is None:
        print(f"no chart: matplotlib is not available ({png} not written)")
        return
    others = [s for s in systems if s != ref]
    n = max(1, len(others))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(phases) + 2), 5.5))
    colors = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]
    vals = [ratio[s, p] for s in others for p in phases if ratio[s, p]]
    for i, s in enumerate(others):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(phases))]
        ys = [ratio[s, p] or 0 for p in phases]
        bars = ax.bar(xs, ys, width, label=s, color=colors[i % len(colors)])
        for b, y in zip(bars, ys):
            if y:
                ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom",
                            fontsize=6, rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="black", linewidth=1, label=f"{ref} = 1")
    first = True
    for j, p in enumerate(phases):
        t = target_for(p, targets)
        if t is not None:
            ax.hlines(t, j - 0.45, j + 0.45, colors="red", linestyles="dashed", linewidth=1.5,
                      label="target" if first else None)
            first = False
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    if vals:
        lo, hi = min(vals + [0.5]), max(vals + [2.0])
        ax.set_ylim(lo / 1.5, hi * 2.0)
    ax.set_xticks(range(len(phases)))
    ax.set_xticklabels(phases, rotation=30, ha="right")
    ax.set_ylabel(f"ratio to {ref} (> 1: better; log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png + ".tmp.png", dpi=120)
    os.replace(png + ".tmp.png", png)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tsv")
    ap.add_argument("--ref", required=True, help="reference system (ratio 1.0)")
    ap.add_argument("--png", help="chart to write")
    ap.add_argument("--txt", help="also write the table here")
    ap.add_argument("--judge", action="append", help="system judged against the targets (repeatable)")
    ap.add_argument("--target", action="append", help="PATTERNS=MIN, e.g. 'seq*,rand*=1.0'")
    ap.add_argument("--title", default="ratio to the reference, per phase")
    a = ap.parse_args()
    comments, rows = load(a.tsv)
    if not rows:
        sys.exit(f"{a.tsv}: no measurements")
    systems, phases, samples, med, ratio, unit, better = summarize(rows, a.ref)
    targets = parse_targets(a.target)
    judge = a.judge if a.judge else [s for s in systems if s != a.ref]
    text = table(comments, systems, phases, samples, med, ratio, unit, better, a.ref, targets, judge)
    sys.stdout.write(text)
    if a.txt:
        with open(a.txt, "w") as f:
            f.write(text)
    if a.png:
        chart(a.png, a.title, systems, phases, ratio, a.ref, targets)


if __name__ == "__main__":
    main()
