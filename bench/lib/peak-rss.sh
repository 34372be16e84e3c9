# shellcheck shell=bash
# bench/lib/peak-rss.sh — the peak resident memory (VmHWM) of the processes a benchmark started.
# A bash library: source it, then call its function.
#
#   peak_rss_line NAME=PID ...     prints "# peak RSS (VmHWM): NAME N MiB, ..."
#
# Call it while the processes still run (before unmounting or stopping
# them): the kernel forgets VmHWM when a process exits. A PID that is not
# running reads as "gone".

peak_rss_line() {
    local out="" pair name pid kib
    for pair in "$@"; do
        name=${pair%%=*} pid=${pair#*=}
        kib=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        if [[ -n $kib ]]; then out+="${out:+, }$name $((kib / 1024)) MiB"; else out+="${out:+, }$name gone"; fi
    done
    echo "# peak RSS (VmHWM): $out"
}
