#!/usr/bin/env python3
"""Reads the engine benchmark's JSON lines and `openssl speed` output; prints the
ratio table with PASS/FAIL against the issue's targets and draws engine.png.

    report.py --jsonl bench/out/engine.jsonl --openssl bench/out/openssl.txt --png bench/out/engine.png

Standard library only, plus matplotlib for the chart (installed with pip on
first use if missing; without it the table is still printed).
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

# The chart helper (matplotlib, pip-installed once if missing) is shared with bench/lib/plot_ratios.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lib"))
from plot_ratios import matplotlib_or_none  # noqa: E402

# The targets.
SEQ_WRITE_MIN_AEAD_RATIO = 0.50   # large sequential writes >= 50% of single-core AEAD
META_RAND_MAX_PCT = 1.5           # key metadata for 4 KiB random writes
META_SEQ_MAX_PCT = 0.2            # key metadata for 1 MiB sequential writes
COMMIT_FLAT_MAX_RATIO = 1.5       # "flat": big-store commit median <= 1.5 x small-store median


def parse_openssl(path):
    """{block size: MB/s} from every `type ...` / `AES-256-GCM ...` table in the file."""
    rates = {}
    sizes = None
    with open(path) as f:
        for line in f:
            if line.startswith("type"):
                sizes = [int(x) for x in re.findall(r"(\d+) bytes", line)]
            elif sizes and line.upper().startswith("AES-256-GCM"):
                vals = re.findall(r"([\d.]+)k", line)
                for size, val in zip(sizes, vals):
                    rates[size] = float(val) / 1000.0  # 1000s of bytes/s -> MB/s
                sizes = None
    return rates


def load(path):
    by = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                rec = json.loads(line)
                by[rec["bench"]].append(rec)
    return by


def one(by, bench, **match):
    for rec in by.get(bench, []):
        if all(rec.get(k) == v for k, v in match.items()):
            return rec
    return None


def verdict(ok):
    return "PASS" if ok else "FAIL"


def fmt_ratio(x):
    return "" if x is None else f"{x:.2f}x"


def add_cpu_rows(add, rec, aead):
    """Rows for what the engine's own CPU allows: bytes per user-CPU second (all
    threads, so a per-core figure comparable to single-core AEAD; immune to
    the process being descheduled) and bytes per second outside the medium."""
    if rec.get("user_cpu_s"):
        per_core = rec["bytes"] / 1e6 / rec["user_cpu_s"]
        add("  bytes per user-CPU second (per core)", f"{per_core:,.1f} MB/s",
            per_core / aead if aead else None,
            f"user {rec['user_cpu_s']:.2f} s + system {rec['sys_cpu_s']:.2f} s CPU, all threads")
    outside = rec.get("outside_medium_s", rec.get("engine_cpu_s"))
    if outside:
        rate = rec["bytes"] / 1e6 / outside
        add("  bytes per second outside the medium", f"{rate:,.1f} MB/s",
            rate / aead if aead else None, "wall time not spent in medium calls")


def build(by, ossl):
    aead = ossl.get(1048576) or ossl.get(16384)
    aead_label = "1 MiB" if 1048576 in ossl else "16 KiB"
    rows = []  # (figure, value, vs AEAD, vs plain, target, result)

    def add(figure, value, vs_aead=None, vs_plain=None, target="", result=""):
        rows.append((figure, value, fmt_ratio(vs_aead), vs_plain or "", target, result))

    if aead:
        add(f"AES-256-GCM, openssl speed ({aead_label} blocks, 1 core)", f"{aead:,.1f} MB/s", 1.0)
    if 16384 in ossl and aead_label != "16 KiB":
        add("AES-256-GCM, openssl speed (16 KiB blocks)", f"{ossl[16384]:,.1f} MB/s", ossl[16384] / aead)
    for rec in by.get("aead_inprocess", []):
        if rec["unit"] == 32768:
            add(f"ring {rec['op']} in-process, 32 KiB cells", f"{rec['mb_s']:,.1f} MB/s",
                rec["mb_s"] / aead if aead else None)

    pw = one(by, "plain_seq_write")
    sw = one(by, "seq_write")
    if pw:
        add("plain file: 1 MiB write_all + sync_all", f"{pw['mb_s']:,.1f} MB/s",
            pw["mb_s"] / aead if aead else None, "1.00x")
    if sw:
        ratio = sw["mb_s"] / aead if aead else None
        add("oubli seq write: 1 MiB writes + flush", f"{sw['mb_s']:,.1f} MB/s", ratio,
            fmt_ratio(sw["mb_s"] / pw["mb_s"]) if pw else "",
            f">= {SEQ_WRITE_MIN_AEAD_RATIO:.2f}x AEAD", verdict(ratio is not None and ratio >= SEQ_WRITE_MIN_AEAD_RATIO))
        add("oubli seq write + final commit", f"{sw['mb_s_with_commit']:,.1f} MB/s",
            sw["mb_s_with_commit"] / aead if aead else None,
            fmt_ratio(sw["mb_s_with_commit"] / pw["mb_s"]) if pw else "")
        add("oubli seq write before flush (page cache)", f"{sw['mb_s_before_flush']:,.1f} MB/s",
            sw["mb_s_before_flush"] / aead if aead else None,
            (fmt_ratio(sw["mb_s_before_flush"] / pw["mb_s_before_sync"]) + " of plain before sync") if pw else "")
        add_cpu_rows(add, sw, aead)
    for cache in ("warm", "cold"):
        r = one(by, "seq_read", page_cache=cache)
        p = one(by, "plain_seq_read", page_cache=cache)
        if r:
            add(f"oubli seq read, {cache} page cache", f"{r['mb_s']:,.1f} MB/s",
                r["mb_s"] / aead if aead else None,
                (fmt_ratio(r["mb_s"] / p["mb_s"]) + f" of plain read ({p['mb_s']:,.0f})") if p else "")
    r = one(by, "seq_read", page_cache="warm")
    if r:
        add_cpu_rows(add, r, aead)
    pr = one(by, "plain_rand_write")
    rw = one(by, "rand_write")
    if pr:
        add("plain file: random 4 KiB pwrite + sync_all", f"{pr['iops']:,.0f} IOPS", None, "1.00x")
    if rw:
        add("oubli random 4 KiB writes + flush",
            f"{rw['iops']:,.0f} IOPS ({rw['mb_s']:,.1f} MB/s)", None,
            fmt_ratio(rw["iops"] / pr["iops"]) if pr else "")
        add("  write amplification (medium bytes / written)", f"{rw['write_amplification']:.2f}")

    for rec in by.get("commit_units", []):
        add(f"commit, {rec['k']} changed cells ({rec['store_bytes'] >> 20} MiB store)",
            f"{rec['commit_ms']:.2f} ms", None,
            f"{rec['nodes_written']:.0f} nodes, flush {rec['flush_ms']:.1f} ms")
    small = one(by, "commit_size", label="small")
    big = one(by, "commit_size", label="big")
    for rec in (small, big):
        if rec:
            add(f"commit, 1 changed cell, {human(rec['store_bytes'])} store",
                f"{rec['commit_ms']:.2f} ms", None,
                f"{rec['nodes_written']:.0f} nodes, {rec['tree_nodes']} in tree")
    if small and big:
        ratio = big["commit_ms"] / small["commit_ms"]
        add(f"  commit {human(big['store_bytes'])} / {human(small['store_bytes'])}",
            f"{ratio:.2f}x", None, "", f"<= {COMMIT_FLAT_MAX_RATIO:.1f}x (flat)",
            verdict(ratio <= COMMIT_FLAT_MAX_RATIO))

    add_stall_rows(add, by)

    for pattern, limit, label in (("seq_1mib", META_SEQ_MAX_PCT, "1 MiB sequential"),
                                  ("rand_4k", META_RAND_MAX_PCT, "4 KiB random")):
        o = one(by, "overhead", pattern=pattern)
        if not o:
            continue
        add(f"key metadata, {label} (store.overhead())", f"{o['percent']:.3f} %", None,
            f"nodes {o['node_bytes']:,} B + tags {o['tag_bytes']:,} B / data {o['data_bytes']:,} B",
            f"<= {limit} %", verdict(o["percent"] <= limit))
        if abs(o["percent_of_logical"] - o["percent"]) > 1e-9:
            add(f"  same, per byte the application wrote", f"{o['percent_of_logical']:.3f} %", None,
                f"{o['logical_bytes']:,} B written; zero gaps sealed in partial cells count as data above",
                f"(<= {limit} %)", verdict(o["percent_of_logical"] <= limit))
    return rows, aead


def spread(recs, key):
    """Median of `key` over rounds, and its range."""
    import statistics
    xs = [r[key] for r in recs]
    return statistics.median(xs), min(xs), max(xs)


def add_stall_rows(add, by):
    """Issue 15's commit-stall target, flushes beside a writer, the changed-tree cap's commits, and the automatic cleaner's pause beside the cleaner off."""
    quiet = [r for r in by.get("commit_stall", []) if r["mode"] == "no-commits"]
    busy = [r for r in by.get("commit_stall", []) if r["mode"] == "commit-every-1s"]
    if quiet and busy:
        p99, lo, hi = spread(busy, "p99_ms")
        top, _, _ = spread(busy, "max_ms")
        add(f"4 KiB writer, commit every 1 s ({busy[0]['vault_delay_ms']} ms vault): p99",
            f"{p99:.3f} ms", None, f"rounds {lo:.3f}-{hi:.3f} ms; p50 {spread(busy, 'p50_ms')[0]:.3f}, "
            f"max {top:.1f} ms", "<= 5 ms", verdict(hi <= 5.0))
        ratio = spread(busy, "writes_per_s")[0] / spread(quiet, "writes_per_s")[0]
        add("  its throughput / no commits", f"{ratio:.2f}x", None, "", ">= 0.90x", verdict(ratio >= 0.9))
        for mode, label in (("policy-1s", "the policy's, in the writer's path"),
                            ("policy-1s-background", "the policy's, on the committer thread")):
            recs = [r for r in by.get("commit_stall", []) if r["mode"] == mode]
            if not recs:
                continue
            top, lo, hi = spread(recs, "max_ms")
            ratio = spread(recs, "writes_per_s")[0] / spread(quiet, "writes_per_s")[0]
            add(f"4 KiB writer, {label} every 1 s: longest write", f"{top:.1f} ms", None,
                f"rounds {lo:.1f}-{hi:.1f}; p99 {spread(recs, 'p99_ms')[0]:.3f} ms; "
                f"throughput {ratio:.2f}x no commits")
    calm = [r for r in by.get("flush_stall", []) if r["mode"] == "no-flushes"]
    flushed = [r for r in by.get("flush_stall", []) if r["mode"] == "fsync-loop"]
    if calm and flushed:
        for label, recs in (("alone", calm), ("beside a write+flush loop", flushed)):
            top, lo, hi = spread(recs, "max_ms")
            ratio = spread(recs, "writes_per_s")[0] / spread(calm, "writes_per_s")[0]
            detail = f"rounds {lo:.1f}-{hi:.1f}; p99 {spread(recs, 'p99_ms')[0]:.3f} ms; throughput {ratio:.2f}x"
            if recs is flushed:
                detail += (f"; the loop: {spread(recs, 'transactions_per_s')[0]:,.0f} transactions/s, "
                           f"median {spread(recs, 'transaction_median_ms')[0]:.2f} ms")
            add(f"4 KiB writer, {label}: longest write", f"{top:.1f} ms", None, detail)
    capped = {mode: [r for r in by.get("cap_stall", []) if r["mode"] == mode]
              for mode in ("cap-in-writer-path", "cap-background")}
    if all(capped.values()):
        base = spread(capped["cap-in-writer-path"], "files_per_s")[0]
        for mode, label in (("cap-in-writer-path", "in the writer's path"),
                            ("cap-background", "on the committer thread")):
            recs = capped[mode]
            top, lo, hi = spread(recs, "max_ms")
            ratio = spread(recs, "files_per_s")[0] / base
            add(f"file maker, the changed-tree cap's commits {label}: longest", f"{top:.1f} ms", None,
                f"rounds {lo:.1f}-{hi:.1f}; p99 {spread(recs, 'p99_ms')[0]:.3f} ms; "
                f"{spread(recs, 'files_per_s')[0]:,.0f} files/s ({ratio:.2f}x)")
    for pattern in ("seq", "rand"):
        recs = [r for r in by.get("cleaner_stall", []) if r.get("pattern") == pattern]
        off = [r for r in recs if r["mode"] == "cleaner-off"]
        on = [r for r in recs if r["mode"] == "cleaner-default"]
        behind = [r for r in recs if r["mode"] == "cleaner-default-background"]
        if not (off and on):
            continue
        groups = [("cleaner off", off), ("default cleaner", on)]
        if behind:
            groups.append(("default cleaner, background commits", behind))
        for label, group in groups:
            mb, _, _ = spread(group, "mb_per_s")
            top, lo, hi = spread(group, "max_ms")
            add(f"1 MiB {pattern} writer, {label}: longest write", f"{top:.1f} ms", None,
                f"rounds {lo:.1f}-{hi:.1f}; p99 {spread(group, 'p99_ms')[0]:.2f} ms; {mb:,.0f} MB/s; "
                f"medium {spread(group, 'medium_bytes')[0] / (1 << 20):,.0f} MiB")


def quartiles(xs):
    """(25th, 75th) percentiles; both equal the value for a single run."""
    xs = sorted(xs)
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (0.0, 0.0)
    import statistics
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def human(n):
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def print_table(rows, by):
    env = one(by, "env")
    if env:
        print(f"oubli engine benchmark — {env['date']} — {env['cpu']} ({env['cpus']} CPUs), "
              f"kernel {env['kernel']}, {env['openssl']}")
        n = env.get("uncommitted_engine_files", 0)
        dirty = (f", {n} uncommitted files in oubli-core/-crypto/-media/-vault" if n
                 else " (engine crates as committed)")
        print(f"revision {env['rev']}{dirty}; options: {env['args'] or '(defaults)'}; "
              f"load average before the run: {env.get('loadavg_1min_before', '?')}")
    print("DirMedium on the repository's file system, MemoryVault (vault cost not measured). MB = 10^6 B.")
    print()
    head = ("figure", "value", "vs AEAD", "vs plain / detail", "target", "result")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(6)]
    widths[3] = min(widths[3], 58)
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    verdicts = [r[5] for r in rows if r[5] in ("PASS", "FAIL")]
    print()
    print(f"{verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL")


def draw(by, aead, png):
    plt = matplotlib_or_none()
    if plt is None:
        print(f"no chart: matplotlib is not available ({png} not written)")
        return
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    env = one(by, "env")
    fig.suptitle("oubli engine benchmark" + (f" — {env['cpu']}, rev {env['rev']}, {env['date']}" if env else ""))

    def bars(ax, labels, values, colors, unit, title):
        b = ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        for rect, v in zip(b, values):
            ax.annotate(f"{v:,.0f}", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                        ha="center", va="bottom", fontsize=8)

    OUB, AE, PL = "#3b6fb6", "#999999", "#e39b3b"
    sw, pw = one(by, "seq_write"), one(by, "plain_seq_write")
    labels, vals, cols = [], [], []
    if sw:
        labels += ["oubli\n+flush", "oubli\n+flush+commit", "oubli\nbefore flush"]
        vals += [sw["mb_s"], sw["mb_s_with_commit"], sw["mb_s_before_flush"]]
        cols += [OUB] * 3
    if pw:
        labels += ["plain file\n+sync_all", "plain file\nbefore sync"]
        vals += [pw["mb_s"], pw["mb_s_before_sync"]]
        cols += [PL] * 2
    if aead:
        labels.append("AES-256-GCM\nopenssl")
        vals.append(aead)
        cols.append(AE)
    ax = axes[0][0]
    bars(ax, labels, vals, cols, "MB/s", "Sequential write, 1 MiB writes")
    if aead:
        ax.axhline(aead * SEQ_WRITE_MIN_AEAD_RATIO, color="red", ls="--", lw=1)
        ax.text(0, aead * SEQ_WRITE_MIN_AEAD_RATIO, " target: 50% AEAD", color="red", fontsize=8, va="bottom")

    labels, vals, cols = [], [], []
    for cache in ("warm", "cold"):
        r = one(by, "seq_read", page_cache=cache)
        if r:
            labels.append(f"oubli\n{cache} cache")
            vals.append(r["mb_s"])
            cols.append(OUB)
    for cache in ("warm", "cold"):
        p = one(by, "plain_seq_read", page_cache=cache)
        if p:
            labels.append(f"plain file\n{cache} cache")
            vals.append(p["mb_s"])
            cols.append(PL)
    if aead:
        labels.append("AES-256-GCM\nopenssl")
        vals.append(aead)
        cols.append(AE)
    bars(axes[0][1], labels, vals, cols, "MB/s", "Sequential read, 1 MiB reads")

    rw, pr = one(by, "rand_write"), one(by, "plain_rand_write")
    labels, vals, cols = [], [], []
    if rw:
        labels.append("oubli\n+flush")
        vals.append(rw["iops"])
        cols.append(OUB)
    if pr:
        labels.append("plain file\npwrite+sync_all")
        vals.append(pr["iops"])
        cols.append(PL)
    bars(axes[0][2], labels, vals, cols, "IOPS", "Random 4 KiB writes")

    ax = axes[1][0]
    cu = sorted(by.get("commit_units", []), key=lambda r: r["k"])
    if cu:
        ks = [r["k"] for r in cu]
        med = [r["commit_ms"] for r in cu]
        q = [quartiles(r["commit_ms_all"]) for r in cu]
        lo = [max(m - a, 0) for m, (a, _) in zip(med, q)]
        hi = [max(b - m, 0) for m, (_, b) in zip(med, q)]
        ax.errorbar(ks, med, yerr=[lo, hi], marker="o", color=OUB, capsize=3,
                    label="commit (median, interquartile range)")
        ax.plot(ks, [r["flush_ms"] for r in cu], marker="s", color=PL, label="flush before it (median)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("changed cells (4 KiB overwrite each)")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8)
        ax.set_title(f"Commit time vs changed units ({cu[0]['store_bytes'] >> 20} MiB store)", fontsize=10)

    ax = axes[1][1]
    cs = [r for r in (one(by, "commit_size", label="small"), one(by, "commit_size", label="big")) if r]
    if cs:
        xs = range(len(cs))
        ax.bar(xs, [r["commit_ms"] for r in cs], color=OUB, width=0.6)
        top = 3 * max(r["commit_ms"] for r in cs)
        clipped = 0
        for i, r in enumerate(cs):
            runs = r["commit_ms_all"]
            clipped += sum(1 for v in runs if v > top)
            xj = [i - 0.2 + 0.4 * j / max(len(runs) - 1, 1) for j in range(len(runs))]
            ax.scatter(xj, [min(v, top) for v in runs], color="black", s=10, zorder=3)
        ax.set_ylim(0, top * 1.05)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{human(r['store_bytes'])} store\n({r['tree_nodes']} nodes)" for r in cs], fontsize=8)
        ax.set_ylabel("ms (bar: median; dots: every run" + (f", {clipped} clipped" if clipped else "") + ")")
        ax.set_title("Commit time vs store size (1 changed cell)", fontsize=10)
        for i, r in enumerate(cs):
            ax.annotate(f"{r['commit_ms']:.2f} ms", (i, r["commit_ms"] / 2), ha="center", va="center",
                        fontsize=9, color="white")

    ax = axes[1][2]
    ov = [o for o in (one(by, "overhead", pattern="seq_1mib"), one(by, "overhead", pattern="rand_4k")) if o]
    if ov:
        names = {"seq_1mib": "1 MiB sequential", "rand_4k": "4 KiB random"}
        limits = {"seq_1mib": META_SEQ_MAX_PCT, "rand_4k": META_RAND_MAX_PCT}
        xs = range(len(ov))
        node = [100 * o["node_bytes"] / o["data_bytes"] for o in ov]
        tags = [100 * o["tag_bytes"] / o["data_bytes"] for o in ov]
        ax.bar(xs, node, color=OUB, label="tree nodes")
        ax.bar(xs, tags, bottom=node, color=AE, label="AEAD tags")
        for i, o in enumerate(ov):
            ax.plot([i - 0.4, i + 0.4], [limits[o["pattern"]]] * 2, color="red", ls="--", lw=1)
            ax.annotate(f"{o['percent']:.3f} %", (i, o["percent"] / 2), ha="center", va="center",
                        fontsize=9, color="white")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([names[o["pattern"]] for o in ov], fontsize=8)
        ax.set_ylabel("% of data bytes")
        ax.set_title("Key-metadata overhead (red: target)", fontsize=10)
        ax.legend(fontsize=8)

    fig.tight_layout()
    tmp = png + ".tmp"
    fig.savefig(tmp, dpi=110, format="png")
    import os
    os.replace(tmp, png)
    print(f"chart: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--openssl", required=True)
    ap.add_argument("--png")
    a = ap.parse_args()
    by = load(a.jsonl)
    ossl = parse_openssl(a.openssl)
    if not ossl:
        print(f"warning: no AES-256-GCM figure found in {a.openssl}", file=sys.stderr)
    rows, aead = build(by, ossl)
    print_table(rows, by)
    if a.png:
        draw(by, aead, a.png)


if __name__ == "__main__":
    main()
