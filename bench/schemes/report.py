#!/usr/bin/env python3
"""bench/schemes/report.py — the tables and plots of bench/schemes/run.

    report.py JSONL --txt OUT.txt [--png OUT.png] [--tsv OUT.tsv]

Reads the JSON lines of oubli-bench-schemes (preceded by the run's `env`
record) and writes one table per measure, each scheme beside the
parent-pointer reference with its ratio to it, a TSV of every figure
(`scheme measure value unit`), and a six-panel PNG.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from plot_ratios import fmt, matplotlib_or_none  # noqa: E402

REF = "parent-pointer"
SCHEMES = [REF, "keyed-hash-forest", "key-storage-area"]
SHORT = {REF: "pp", "keyed-hash-forest": "khf", "key-storage-area": "ksa"}
EPOCH_TARGET = 0.90  # issue 11: every scheme costs at most 10 % with 5 s epochs
MIB = 2**20


def size_label(b):
    return f"{b // 2**30} GiB" if b >= 2**30 and b % 2**30 == 0 else f"{b // MIB} MiB"


def ratio(x, ref):
    return x / ref if ref else float("nan")


def spread(xs):
    return f"{fmt(min(xs))}-{fmt(max(xs))}" if len(xs) > 1 else ""


def table(title, header, rows):
    """A fixed-width table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [title, line(header), "-" * len(line(header))]
    out += [line(r) for r in rows]
    return "\n".join(out) + "\n"


def by(records, bench):
    return [r for r in records if r.get("bench") == bench]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--txt", required=True)
    ap.add_argument("--png")
    ap.add_argument("--tsv")
    a = ap.parse_args()
    records = [json.loads(line) for line in open(a.jsonl) if line.startswith("{")]
    env = next((r for r in records if r["bench"] == "env"), {})
    config = next((r for r in records if r["bench"] == "config"), {})
    tsv = []
    out = [
        f"oubli key schemes side by side — {env.get('date', '?')} — {env.get('cpu', '?')} ({env.get('cpus', '?')} CPUs), "
        f"kernel {env.get('kernel', '?')}",
        f"revision {env.get('rev', '?')} ({env.get('uncommitted_engine_files', '?')} uncommitted engine files); "
        f"command: bench/schemes/run {env.get('args', '')}".rstrip(),
        f"load average (1 min) before the run: {env.get('loadavg_1min_before', '?')}, after: {env.get('loadavg_1min_after', '?')}",
        "DirMedium + file vault (light KDF), 32 KiB cells, cleaner off. Ratios: scheme / parent-pointer "
        "(> 1 = more for throughput; for times > 1 = slower).",
        "",
    ]

    # Throughput.
    tp = by(records, "throughput")
    workloads = list(dict.fromkeys(r["workload"] for r in tp))
    rows = []
    thr = {}
    for w in workloads:
        unit = "MB/s" if w == "seq-1m" else "ops/s"
        key = "mb_s" if w == "seq-1m" else "ops_s"
        vals = {s: [r[key] for r in tp if r["workload"] == w and r["scheme"] == s] for s in SCHEMES}
        med = {s: statistics.median(v) for s, v in vals.items() if v}
        thr[w] = {s: ratio(med[s], med[REF]) for s in med}
        row = [w, unit]
        for s in SCHEMES:
            row += [fmt(med.get(s)), spread(vals[s]), f"{ratio(med.get(s, 0), med[REF]):.2f}x" if s != REF else ""]
            tsv.append((s, f"throughput:{w}", med.get(s), unit))
        rows.append(row)
    header = ["workload", "unit"]
    for s in SCHEMES:
        header += [SHORT[s] + " median", "range", "vs pp" if s != REF else ""]
    rounds = config.get("rounds", "?")
    out.append(table(
        f"1. Throughput (median of {rounds} rounds; each figure includes the final flush + commit)", header, rows))
    out.append(
        f"   seq-1m: {config.get('seq_bytes', 0) // MIB} MiB in 1 MiB writes; zipf-4k: {config.get('rand_writes')} "
        f"Zipfian (theta 0.99) 4 KiB overwrites of a preallocated {config.get('rand_span', 0) // MIB} MiB object; "
        f"files: {config.get('files')} files of {config.get('file_size')} B;\n   ycsb-*: {config.get('ycsb_ops')} ops over "
        f"{config.get('records')} records of 1 KiB in one object (A 50/50 read/update, B 95/5, F 50/50 read/read-modify-write).\n")

    # Key metadata.
    rows = []
    meta = {}
    for w in workloads:
        per = {}
        for s in SCHEMES:
            rs = [r for r in tp if r["workload"] == w and r["scheme"] == s and "units" in r and r["round"] == 0]
            if rs:
                per[s] = rs[0]
        if REF not in per:
            continue
        meta[w] = per
        for s in SCHEMES:
            r = per.get(s)
            if not r:
                continue
            extra = f"roots {r['roots']}" if "roots" in r else f"keys {r['keys']}" if "keys" in r else ""
            rows.append([w if s == REF else "", s, f"{r['units']:,}", r["key_ref_bytes"], f"{r['state_bytes']:,}",
                         f"{r['key_metadata_bytes']:,}", f"{r['key_metadata_bytes_per_unit']:.2f}",
                         f"{ratio(r['key_metadata_bytes'], per[REF]['key_metadata_bytes']):.2f}x", extra])
            tsv.append((s, f"key_metadata_per_unit:{w}", r["key_metadata_bytes_per_unit"], "B"))
            tsv.append((s, f"key_metadata_total:{w}", r["key_metadata_bytes"], "B"))
    out.append(table(
        "2. Key metadata after each workload's commit (round 0): units = cells + tree nodes; total = units x key reference + "
        "scheme state",
        ["workload", "scheme", "units", "ref B/unit", "state B", "total B", "B/unit", "vs pp", "forest/area"], rows))
    out.append("   `ref B/unit` is what the scheme needs (DESIGN §16); since format 5 a leaf stores a cell's index "
               "reference as a varint (inner nodes and the log keep 32 bytes).\n")

    # Commit vs store size.
    cs = by(records, "commit_size")
    sizes = sorted(set(r["store_bytes"] for r in cs))
    commit = {(r["scheme"], r["store_bytes"]): r for r in cs}
    rows = []
    for b in sizes:
        row = [size_label(b)]
        for s in SCHEMES:
            r = commit.get((s, b))
            row += [f"{fmt(r['commit_ms'])} ({fmt(r['commit_ms_min'])})" if r else "-",
                    f"{r['state_bytes']:,}" if r else "-"]
            if s != REF:
                row.append(f"{ratio(r['commit_ms'], commit[(REF, b)]['commit_ms']):.2f}x" if r and (REF, b) in commit else "")
            if r:
                tsv.append((s, f"commit_ms:{size_label(b)}", r["commit_ms"], "ms"))
        rows.append(row)
    for stat, name in (("commit_ms", "medians"), ("commit_ms_min", "minima")):
        if len(sizes) < 2:
            break
        row = [f"{size_label(sizes[-1])} / {size_label(sizes[0])}, {name}"]
        for s in SCHEMES:
            lo, hi = commit.get((s, sizes[0])), commit.get((s, sizes[-1]))
            row += [f"{hi[stat] / lo[stat]:.2f}x" if lo and hi else "-", ""]
            if s != REF:
                row.append("")
        rows.append(row)
    header = ["store"]
    for s in SCHEMES:
        header += [SHORT[s] + " ms (min)", "state B"] + (["vs pp"] if s != REF else [])
    out.append(table(
        f"3. Commit time against store size: one 4 KiB overwrite, flush, timed commit (median and minimum of "
        f"{config.get('commit_runs', '?')}; the schemes alternate; `vs pp` of the medians)", header, rows))

    # Deletion latency.
    dl = {r["scheme"]: r for r in by(records, "deletion")}
    rows = []
    for s in SCHEMES:
        r = dl.get(s)
        if not r:
            continue
        ref = dl.get(REF, r)
        rows.append([s, fmt(r["p50_ms"]), fmt(r["p99_ms"]), fmt(r["max_ms"]),
                     f"{ratio(r['p50_ms'], ref['p50_ms']):.2f}x", f"{ratio(r['p99_ms'], ref['p99_ms']):.2f}x"])
        tsv += [(s, "deletion_p50", r["p50_ms"], "ms"), (s, "deletion_p99", r["p99_ms"], "ms")]
    if dl:
        r0 = next(iter(dl.values()))
        out.append(table(
            f"4. Deletion latency: rm of a committed {r0['file_bytes'] // 1024} KiB file + commit, until the commit returns "
            f"({r0['deletions']} per scheme, in a {size_label(r0['store_bytes'])} store; the schemes take turns)",
            ["scheme", "p50 ms", "p99 ms", "max ms", "p50 vs pp", "p99 vs pp"], rows))

    # Epoch cost.
    ep = by(records, "epoch")
    rows = []
    epoch_ratio = {}
    for s in SCHEMES:
        mine = [r for r in ep if r["scheme"] == s]
        if not mine:
            continue
        rounds_seen = sorted(set(r["round"] for r in mine))
        pairs = []
        for rd in rounds_seen:
            on = [r for r in mine if r["round"] == rd and r["mode"] == "epochs"]
            off = [r for r in mine if r["round"] == rd and r["mode"] == "no-epochs"]
            if on and off:
                pairs.append(on[0]["ops_s"] / off[0]["ops_s"])
        on = [r["ops_s"] for r in mine if r["mode"] == "epochs"]
        off = [r["ops_s"] for r in mine if r["mode"] == "no-epochs"]
        commits = [r["commits"] for r in mine if r["mode"] == "epochs"]
        rt = statistics.median(pairs)
        epoch_ratio[s] = rt
        rows.append([s, fmt(statistics.median(off)), fmt(statistics.median(on)), f"{rt:.2f}x",
                     " ".join(f"{p:.2f}" for p in pairs), statistics.median(commits),
                     f">= {EPOCH_TARGET:.2f}x", "PASS" if rt >= EPOCH_TARGET else "FAIL"])
        tsv.append((s, "epoch_ratio", rt, "x"))
    if ep:
        out.append(table(
            f"5. Throughput with a commit every {ep[0]['epoch_secs']} s against no commits: Zipfian 4 KiB overwrites of a "
            f"{config.get('epoch_span', 0) // MIB} MiB object for {config.get('epoch_seconds')} s + flush, fresh store per run",
            ["scheme", "no epochs w/s", "epochs w/s", "ratio", "per round", "commits", "target", "result"], rows))
        out.append("   ratio: median over rounds of (epochs / no epochs) within the round. Lethe: -17.6 % against ZFS.\n")

    # Forest over time.
    fo = by(records, "forest")
    labels = list(dict.fromkeys(r["store"] for r in fo))
    steps = sorted(set(r["step"] for r in fo))
    at = {(r["store"], r["step"]): r for r in fo}
    rows = []
    for st in steps:
        row = [st]
        for lb in labels:
            r = at.get((lb, st), {})
            n = r.get("roots", r.get("keys"))
            row += ["-" if n is None else f"{n:,}", f"{r.get('state_bytes', 0):,}", fmt(r.get("commit_ms"))]
            if lb == "forest-consolidated":
                row.append(fmt(r.get("consolidate_ms")) if "consolidate_ms" in r else "")
        rows.append(row)
    header = ["step"]
    for lb in labels:
        name = {"forest": "khf", "forest-consolidated": "khf+cons.", "key-storage-area": "ksa"}.get(lb, lb)
        header += [name + (" keys" if lb == "key-storage-area" else " roots"), "state B", "commit ms"]
        if lb == "forest-consolidated":
            header.append("consol. ms")
    if fo:
        out.append(table(
            f"6. Forest size over time: {config.get('forest_live_files')} files of 4 KiB, then per step "
            f"{config.get('forest_churn')} random files deleted and as many created, commit; khf+cons.: "
            f"consolidate_keys every {config.get('forest_consolidate_every')} steps (figures after it)",
            header, rows))
        last = steps[-1]
        for lb in labels:
            r = at.get((lb, last))
            if r:
                tsv.append((lb, "forest_final_roots_or_keys", r.get("roots", r.get("keys")), "count"))

    text = "\n".join(out)
    with open(a.txt, "w") as f:
        f.write(text)
    print(text)
    if a.tsv:
        with open(a.tsv, "w") as f:
            f.write(f"# bench/schemes at {env.get('rev', '?')}, {env.get('date', '?')}, load {env.get('loadavg_1min_before', '?')}\n")
            for s, m, v, u in tsv:
                if v is not None:
                    f.write(f"{s}\t{m}\t{v:.6g}\t{u}\n")
    if a.png:
        plot(a.png, env, thr, meta, commit, sizes, dl, epoch_ratio, at, labels, steps)


def plot(png, env, thr, meta, commit, sizes, dl, epoch_ratio, at, labels, steps):
    plt = matplotlib_or_none()
    if plt is None:
        print(f"no chart: matplotlib is not available ({png} not written)")
        return
    fig, ax = plt.subplots(2, 3, figsize=(17, 9))
    others = [s for s in SCHEMES if s != REF]

    def bars(axis, groups, values, ylabel, title, line=None):
        width = 0.8 / len(values)
        for k, (name, vs) in enumerate(values.items()):
            axis.bar([x - 0.4 + width * (k + 0.5) for x in range(len(groups))], vs, width, label=name)
        axis.set_xticks(range(len(groups)), groups, rotation=20, fontsize=8)
        axis.set_ylabel(ylabel)
        axis.set_title(title, fontsize=10)
        if line is not None:
            axis.axhline(line, color="k", ls="--", lw=1)
        axis.legend(fontsize=7)

    ws = list(thr)
    bars(ax[0][0], ws, {s: [thr[w].get(s, 0) for w in ws] for s in others}, "throughput / parent-pointer",
         "throughput vs parent-pointer", line=1.0)
    mw = list(meta)
    bars(ax[0][1], mw, {s: [meta[w].get(s, {}).get("key_metadata_bytes_per_unit", 0) for w in mw] for s in SCHEMES},
         "key metadata bytes per unit", "key metadata per unit (refs + state)")
    for s in SCHEMES:
        pts = [(b / MIB, commit[(s, b)]["commit_ms"]) for b in sizes if (s, b) in commit]
        if pts:
            ax[0][2].plot(*zip(*pts), marker="o", label=s)
    ax[0][2].set_xscale("log")
    ax[0][2].set_xlabel("store size, MiB")
    ax[0][2].set_ylabel("commit ms (median)")
    ax[0][2].set_title("commit time vs store size (1 changed block)", fontsize=10)
    ax[0][2].legend(fontsize=7)
    ds = [s for s in SCHEMES if s in dl]
    bars(ax[1][0], ds, {q: [dl[s][f"{q}_ms"] for s in ds] for q in ("p50", "p99", "max")}, "ms",
         "deletion latency (rm + commit)")
    es = [s for s in SCHEMES if s in epoch_ratio]
    bars(ax[1][1], es, {"epochs / no epochs": [epoch_ratio[s] for s in es]}, "throughput ratio",
         f"5 s epochs vs none (target >= {EPOCH_TARGET})", line=EPOCH_TARGET)
    for lb in labels:
        pts = [(st, at[(lb, st)].get("roots", at[(lb, st)].get("keys"))) for st in steps if (lb, st) in at]
        ax[1][2].plot(*zip(*pts), marker=".", label=lb + (" (keys)" if lb == "key-storage-area" else " (roots)"))
    ax[1][2].set_yscale("log")
    ax[1][2].set_xlabel("step (random deletions + creations, commit)")
    ax[1][2].set_ylabel("roots / keys")
    ax[1][2].set_title("forest roots over time, with and without consolidation", fontsize=10)
    ax[1][2].legend(fontsize=7)
    fig.suptitle(f"bench/schemes at {env.get('rev', '?')} ({env.get('date', '?')}, load {env.get('loadavg_1min_before', '?')})")
    fig.tight_layout()
    fig.savefig(png, dpi=90)


if __name__ == "__main__":
    main()
