# scripts/lib/packages.sh: install missing Debian packages (sourced by scripts/test and scripts/demo).
#
# Usage: install_packages WHO ENTRY...
# Each ENTRY is "package" or "package:command"; the command, when given and
# found on PATH, proves the package's job is done even if it came from
# elsewhere. Missing packages are installed with apt-get when running as
# root; otherwise the function prints the install command and returns 1.
# WHO names the calling script in messages.

install_packages() {
    local who=$1
    shift
    local missing=() entry pkg cmd
    for entry in "$@"; do
        pkg=${entry%%:*}
        cmd=${entry#*:}
        if [[ $cmd != "$entry" ]] && command -v "$cmd" >/dev/null 2>&1; then
            continue
        fi
        if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            continue
        fi
        missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        # One line per step; apt's own output only when a step fails.
        local log
        log=$(mktemp)
        echo "$who: updating the package lists"
        if ! apt-get update -qq >"$log" 2>&1; then
            cat "$log" >&2
            rm -f "$log"
            return 1
        fi
        echo "$who: installing ${missing[*]}"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >"$log" 2>&1; then
            cat "$log" >&2
            rm -f "$log"
            return 1
        fi
        rm -f "$log"
    else
        echo "$who: missing packages: ${missing[*]} (run as root, or: sudo apt-get install -y ${missing[*]})" >&2
        return 1
    fi
}
