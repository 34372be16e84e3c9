# bench/lib/baseline.sh — the oubli CLI of an earlier revision, for a
# before/after comparison inside one benchmark run (bench/fs/run and
# bench/nbd/run, --baseline REV).
#
#   baseline_build REV   builds REV's `oubli` in release mode and sets
#                        BASELINE_BIN (its path) and BASELINE_REV (the short
#                        revision)
#   baseline_report TSV TXT REV   the run's oubli against oubli-before,
#                        paired round by round, into TXT
#
# The source is REV's tree taken with `git archive` (no worktree: nothing
# in .git changes) into bench/out/baseline-REV/src, built with its own
# Cargo.lock into bench/out/baseline-REV/target. Both are kept, so the next
# run against the same revision does not build again; remove the directory
# to get the space back (about 2 GB).
#
# The baseline binary makes and serves its own store in the format of its
# day; nothing else of the run depends on it.

baseline_build() {
    local want=$1 repo out full dir
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    out="$repo/bench/out"
    full=$(git -C "$repo" rev-parse --verify --quiet "$want^{commit}") ||
        { echo "baseline: $want is not a revision of $repo" >&2; return 2; }
    BASELINE_REV=$(git -C "$repo" rev-parse --short "$full")
    dir="$out/baseline-$BASELINE_REV"
    if [[ ! -f $dir/src/Cargo.toml ]]; then
        rm -rf "$dir/src"
        mkdir -p "$dir/src"
        git -C "$repo" archive "$full" | tar -x -C "$dir/src"
    fi
    echo "== building the baseline oubli at $BASELINE_REV (release, in $dir)"
    (cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo build --release --quiet -p oubli) ||
        { echo "baseline: $BASELINE_REV does not build" >&2; return 1; }
    BASELINE_BIN="$dir/target/release/oubli"
}

# baseline_report TSV TXT REV: oubli against oubli-before, paired round by
# round (both ran in each round, in the runner's rotating order), printed
# and written to TXT. REV is the revision oubli ran at.
baseline_report() {
    local tsv=$1 txt=$2 rev=$3 repo
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    {
        echo "# oubli at $rev against oubli-before at $BASELINE_REV, round by round (the two ran in the same round): > 1 means faster now"
        python3 "$repo/bench/lib/paired_ratios.py" "$tsv" --ref oubli-before --judge oubli --target 1.0
    } | tee "$txt"
}
