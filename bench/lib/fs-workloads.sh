# shellcheck shell=bash
# bench/lib/fs-workloads.sh — file-system workloads shared by the benchmarks
# (bench/fs/run on FUSE mounts, bench/nbd/run on an ext4 on each NBD device).
# A bash library: source it, then call its functions.
#
#   source bench/lib/fs-workloads.sh
#   fs_workloads DIR                 # every selected phase, in order, in DIR
#   fs_bench_phase DIR PHASE         # one phase (phases depend on earlier ones: see below)
#   fs_bench_phases                  # prints the selected phase names, in order
#   fs_bench_prepare_tree TREE CACHE # TREE: subset|full|FILE.tar; exports FS_BENCH_TREE and
#                                    # FS_BENCH_TREE_DIR, sets FS_BENCH_TREE_DESC (needs
#                                    # linux-source-6.1 for subset|full)
#
# Every phase prints one TSV line on stdout:
#
#   phase<TAB>value<TAB>unit<TAB>better        better is "higher" or "lower"
#
# e.g. "seqwrite	612.3	MB/s	higher" or "tree-unpack	14.21	s	lower".
# Progress and warnings go to stderr. DIR must exist and should be empty;
# the phases leave it empty again at the end. Dropping the page cache
# (sync; echo 3 >/proc/sys/vm/drop_caches) before each phase needs root;
# without it the phases run warm and a warning is printed once.
#
# Phases, in order (MB = 10^6 B):
#
#   seqwrite       fio: FS_BENCH_SEQ_SIZE in 1 MiB writes, then fsync          MB/s
#   seqread        fio: the same file in 1 MiB reads, cold cache; then removed MB/s
#   randwrite      fio: 4 KiB writes at random offsets of a FS_BENCH_RAND_SIZE
#                  file for FS_BENCH_RAND_RUNTIME s, then fsync                MB/s
#   randread       fio: 4 KiB random reads of it, cold cache, same runtime;
#                  then removed                                                MB/s
#   par-seqwrite   fio, 4 jobs: 4 files of FS_BENCH_RAND_SIZE, 1 MiB writes    MB/s
#   par-seqread    fio, 4 jobs: reading them back, cold cache                  MB/s
#   par-randread   fio, 4 jobs: 4 KiB random reads of them, runtime as above;
#                  then removed                                                MB/s
#   sync-1job      fio: 4 KiB writes at random offsets of a FS_BENCH_SYNC_SIZE
#                  file, each followed by fsync (a database committing), for
#                  FS_BENCH_SYNC_RUNTIME s; then removed                       MB/s
#   sync-4jobs     the same with 4 jobs, a file each (4 connections)           MB/s
#   files-create   FS_BENCH_FILES one-line files in one directory from a bash
#                  loop (no fork per file)                                     s
#   files-delete   rm -rf of that directory                                    s
#   tree-unpack    tar -xf FS_BENCH_TREE (an uncompressed .tar) into DIR/a     s
#                  (tar's "Directory renamed before its status could be
#                  extracted", seen on CryFS, is reported and tolerated).
#                  The .tar is read into the page cache after the drop and
#                  before the clock starts: the figure is the file system
#                  being written, not the disk the .tar sits on (on a shared
#                  VM that disk's rate varied 3x between rounds, and one
#                  cold read of the 124 MiB tree doubled the phase)
#   tree-copy      cp -a DIR/a DIR/b (within the file system), cold cache      s
#   tree-grep      grep -rF FS_BENCH_GREP DIR/a, cold cache                    s
#   tree-md5       find DIR/a -type f | xargs md5sum, cold cache               s
#   tree-remove    rm -rf DIR/a DIR/b (both trees), cold cache                 s
#
# More groups, each selected by name in FS_BENCH_GROUPS (issue 43):
#
#   stream-rand    fio: a FS_BENCH_STREAM_SIZE file written sequentially
#                  in 1 MiB writes (untimed), then 4 KiB writes at random
#                  offsets with fdatasync every 8 writes for
#                  FS_BENCH_STREAM_RUNTIME s (a VM image or database copied
#                  in, then updated in place); then removed                    IOPS
#   bufwrite       fio: buffered 4 KiB writes at random offsets of a
#                  FS_BENCH_RAND_SIZE file for FS_BENCH_RAND_RUNTIME s, no
#                  fsync at all (randwrite ends with one); then removed       MB/s
#   files4k-create FS_BENCH_FILES files of 4 KiB in one directory from a bash
#                  loop                                                        s
#   files4k-delete rm -rf of that directory                                    s
#   dev-copy       a developer's day on the tree: cp -r of the extracted tree
#                  (FS_BENCH_TREE unpacked once beside it, read into the page
#                  cache before the clock starts) into DIR/dev                 s
#   dev-commit     git init (untimed), then git add -A + git commit            s
#   dev-status     git status                                                  s
#   dev-grep       grep -rF FS_BENCH_GREP over the tree (not .git)            s
#   dev-edit       append a line to 200 of its files (every Nth of git
#                  ls-files) and git commit -a                                 s
#   dev-remove     rm -rf DIR/dev                                              s
#
# The dev-* phases after dev-copy run warm (no cache drop: a developer's
# tree is in the caches, and the kernel's own caches of a mount are part of
# what they measure); every other phase starts cold.
#
# seqread needs seqwrite, randread needs randwrite, par-seqread and
# par-randread need par-seqwrite, files-delete needs files-create, and the
# tree phases need tree-unpack (tree-remove also removes the copy if there),
# files4k-delete needs files4k-create and the dev-* phases need dev-copy.
# Timed commands are not followed by a sync (except fio's end_fsync on the
# write phases): the figure is how long the command takes, as the ERASER
# paper's Table 2 measured it. Every phase starts with a dropped page cache.
# With FS_BENCH_SYNC=1 the files-* and tree-* phases time the command and
# then `sync -f DIR`: what the command changed reaches the device inside the
# figure (on ext4 that is the journal commit, where freed blocks are
# discarded and where a block device that infers deletes does its work).
#
# Settings (environment variables; defaults in brackets):
#
#   FS_BENCH_GROUPS        groups to run, any of: seq rand par sync files tree
#                          stream buf files4k dev [seq rand files tree];
#                          "tree" and "dev" are skipped if FS_BENCH_TREE is
#                          empty
#   FS_BENCH_SEQ_SIZE      sequential file size, fio syntax [1G]
#   FS_BENCH_RAND_SIZE     random-I/O file size (and each par-* file) [256M]
#   FS_BENCH_RAND_RUNTIME  seconds per random-I/O phase [15]
#   FS_BENCH_SYNC_SIZE     file size of each sync-* job [64M]
#   FS_BENCH_SYNC_RUNTIME  seconds per sync-* phase [10]
#   FS_BENCH_FILES         small files created and deleted (files and
#                          files4k) [5000]
#   FS_BENCH_STREAM_SIZE   the streamed file of stream-rand [128M]
#   FS_BENCH_STREAM_RUNTIME  seconds of its random writes [20]
#   FS_BENCH_DEV_EDITS     files dev-edit changes [200]
#   FS_BENCH_TREE          path of an uncompressed .tar of a source tree [""]
#   FS_BENCH_GREP          fixed string searched by tree-grep [MODULE_LICENSE]
#   FS_BENCH_DROP          1: drop the page cache before each phase (needs
#                          root), 0: don't [1]
#   FS_BENCH_SYNC          1: the files-* and tree-* phases end with a timed
#                          `sync -f DIR`, 0: they don't [0]
#
# A quick run: FS_BENCH_SEQ_SIZE=64M FS_BENCH_RAND_SIZE=32M
# FS_BENCH_RAND_RUNTIME=3 FS_BENCH_FILES=500.
#
# Needs bash >= 5 (EPOCHREALTIME), fio, GNU tar, coreutils, findutils, grep.

fs_bench_phases() {
    local groups=" ${FS_BENCH_GROUPS:-seq rand files tree} "
    [[ $groups == *" seq "* ]] && printf '%s\n' seqwrite seqread
    [[ $groups == *" rand "* ]] && printf '%s\n' randwrite randread
    [[ $groups == *" par "* ]] && printf '%s\n' par-seqwrite par-seqread par-randread
    [[ $groups == *" sync "* ]] && printf '%s\n' sync-1job sync-4jobs
    [[ $groups == *" files "* ]] && printf '%s\n' files-create files-delete
    [[ $groups == *" tree "* && -n ${FS_BENCH_TREE:-} ]] &&
        printf '%s\n' tree-unpack tree-copy tree-grep tree-md5 tree-remove
    [[ $groups == *" stream "* ]] && printf '%s\n' stream-rand
    [[ $groups == *" buf "* ]] && printf '%s\n' bufwrite
    [[ $groups == *" files4k "* ]] && printf '%s\n' files4k-create files4k-delete
    [[ $groups == *" dev "* && -n ${FS_BENCH_TREE:-} ]] &&
        printf '%s\n' dev-copy dev-commit dev-status dev-grep dev-edit dev-remove
    return 0
}

_fs_bench_drop_warned=0
fs_bench_drop() {
    [[ ${FS_BENCH_DROP:-1} == 1 ]] || return 0
    sync
    if [[ -w /proc/sys/vm/drop_caches ]]; then
        echo 3 >/proc/sys/vm/drop_caches
    elif ((!_fs_bench_drop_warned)); then
        echo "fs-workloads: cannot drop the page cache (not root?): phases run warm" >&2
        _fs_bench_drop_warned=1
    fi
}

# _fs_bench_fio FIELD DIR FIO-ARGS...: the fio job's rate in MB/s.
# fio terse v3: field 7 = read KiB/s, field 48 = write KiB/s (KiB = 1024 B).
_fs_bench_fio() {
    local field=$1 dir=$2 out
    shift 2
    if ! out=$(fio --directory="$dir" --output-format=terse --terse-version=3 --group_reporting "$@" 2>&1); then
        printf 'fs-workloads: fio failed in %s:\n%s\n' "$dir" "$out" >&2
        return 1
    fi
    printf '%s\n' "$out" | awk -F';' -v f="$field" '$1 == "3" {printf "%.1f", $f * 1.024 / 1000; ok = 1} END {exit !ok}'
}

# _fs_bench_fio_iops DIR FIO-ARGS...: the fio job's write IOPS (terse v3
# field 49).
_fs_bench_fio_iops() {
    local dir=$1 out
    shift
    if ! out=$(fio --directory="$dir" --output-format=terse --terse-version=3 --group_reporting "$@" 2>&1); then
        printf 'fs-workloads: fio failed in %s:\n%s\n' "$dir" "$out" >&2
        return 1
    fi
    printf '%s\n' "$out" | awk -F';' '$1 == "3" {printf "%.0f", $49; ok = 1} END {exit !ok}'
}

# _fs_bench_time CMD...: runs CMD (then, with FS_BENCH_SYNC=1, syncs the
# file system of $_fs_bench_dir), prints the wall time in seconds.
_fs_bench_time() {
    local t0=$EPOCHREALTIME
    "$@" || return 1
    if [[ ${FS_BENCH_SYNC:-0} == 1 ]]; then
        sync -f "$_fs_bench_dir" || return 1
    fi
    local t1=$EPOCHREALTIME
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}'
}

_fs_bench_create_files() {
    local dir=$1 n=$2 i
    mkdir "$dir"
    for ((i = 1; i <= n; i++)); do
        echo "small file $i" >"$dir/f$i"
    done
}

# _fs_bench_create_4k DIR N: N files of 4 KiB each (one write each).
_fs_bench_create_4k() {
    local dir=$1 n=$2 i block
    printf -v block '%4096s' ''
    mkdir "$dir"
    for ((i = 1; i <= n; i++)); do
        printf '%s' "$block" >"$dir/f$i"
    done
}

# git with an identity, no automatic gc, and no ownership check (the mounts
# are owned by whoever ran the benchmark).
_fs_bench_git() {
    git -c user.name=bench -c user.email=bench@localhost -c gc.auto=0 -c safe.directory='*' "$@"
}

_fs_bench_git_commit_all() {
    _fs_bench_git -C "$1" add -A && _fs_bench_git -C "$1" commit -q -m "$2"
}

_fs_bench_git_status() {
    _fs_bench_git -C "$1" status --porcelain >/dev/null
}

# _fs_bench_edit DIR LIST: appends a line to each file named in LIST (paths
# relative to DIR), then commits them all.
_fs_bench_edit() {
    local d=$1 f
    while IFS= read -r f; do
        echo "/* edited by the benchmark */" >>"$d/$f" || return 1
    done <"$2"
    _fs_bench_git -C "$d" commit -q -a -m edit
}

# _fs_bench_dev_src: the tree of the dev-* phases, FS_BENCH_TREE unpacked
# once into FS_BENCH_TREE_DIR (a directory beside the .tar in the tree
# cache, kept). Prints its top directory.
_fs_bench_dev_src() {
    local dir=${FS_BENCH_TREE_DIR:-${FS_BENCH_TREE%.tar}.d}
    if [[ ! -e $dir/.complete || $dir/.complete -ot $FS_BENCH_TREE ]]; then
        echo "fs-workloads: unpacking $FS_BENCH_TREE into $dir (once)" >&2
        rm -rf "$dir"
        mkdir -p "$dir/tree"
        tar -xf "$FS_BENCH_TREE" -C "$dir/tree" || return 1
        touch "$dir/.complete"
    fi
    echo "$dir/tree"
}

# tar -xf, tolerating one failure only: "Directory renamed before its status
# could be extracted", which tar reports when a directory's inode number
# changed while it was being filled (CryFS 0.11 does not keep inode numbers
# stable). The files are all there; only that directory's mode and times
# are not restored. A warning on stderr counts them.
_fs_bench_untar() {
    local err rc=0
    err=$(tar -xf "$1" -C "$2" 2>&1) || rc=$?
    ((rc == 0)) && return 0
    if ! grep -v -e 'Directory renamed before its status could be extracted' \
        -e 'Exiting with failure status due to previous errors' <<<"$err" | grep -q .; then
        echo "fs-workloads: tar in $2: $(grep -c 'Directory renamed' <<<"$err") directories changed inode number while being extracted (ignored)" >&2
        return 0
    fi
    printf '%s\n' "$err" >&2
    return "$rc"
}

# _fs_bench_grep STRING DIR [GREP-OPTIONS...]
_fs_bench_grep() {
    local rc=0
    grep -rF "${@:3}" -- "$1" "$2" >/dev/null || rc=$?
    ((rc <= 1)) # 1 = no match, fine; 2 = error
}

_fs_bench_md5() {
    find "$1" -type f -print0 | xargs -0 -r md5sum >/dev/null
}

# fs_bench_phase DIR PHASE: runs one phase, prints its TSV line.
fs_bench_phase() {
    local d=$1 phase=$2 v=
    # shellcheck disable=SC2016 # fio expands $jobnum itself
    local par='fsb-par.$jobnum' sync='fsb-sync.$jobnum'
    local seq=${FS_BENCH_SEQ_SIZE:-1G} rsize=${FS_BENCH_RAND_SIZE:-256M} rt=${FS_BENCH_RAND_RUNTIME:-15}
    [[ -d $d ]] || { echo "fs-workloads: $d is not a directory" >&2; return 1; }
    _fs_bench_dir=$d
    case $phase in
        dev-copy) fs_bench_drop ;;
        dev-*) sync ;;
        *) fs_bench_drop ;;
    esac
    case $phase in
        seqwrite) v=$(_fs_bench_fio 48 "$d" --name=sw --rw=write --bs=1M --size="$seq" --end_fsync=1 --filename=fsb-seq) ;;
        seqread)
            v=$(_fs_bench_fio 7 "$d" --name=sr --rw=read --bs=1M --size="$seq" --filename=fsb-seq)
            rm -f "$d/fsb-seq" ;;
        randwrite) v=$(_fs_bench_fio 48 "$d" --name=rw --rw=randwrite --bs=4k --size="$rsize" --time_based --runtime="$rt" --end_fsync=1 --filename=fsb-rand) ;;
        randread)
            v=$(_fs_bench_fio 7 "$d" --name=rr --rw=randread --bs=4k --size="$rsize" --time_based --runtime="$rt" --filename=fsb-rand)
            rm -f "$d/fsb-rand" ;;
        par-seqwrite) v=$(_fs_bench_fio 48 "$d" --name=pw --rw=write --bs=1M --size="$rsize" --numjobs=4 --filename_format="$par" --end_fsync=1) ;;
        par-seqread) v=$(_fs_bench_fio 7 "$d" --name=pr --rw=read --bs=1M --size="$rsize" --numjobs=4 --filename_format="$par") ;;
        par-randread)
            v=$(_fs_bench_fio 7 "$d" --name=prr --rw=randread --bs=4k --size="$rsize" --numjobs=4 --time_based --runtime="$rt" --filename_format="$par")
            rm -f "$d"/fsb-par.* ;;
        sync-1job | sync-4jobs)
            local jobs=1
            [[ $phase == sync-4jobs ]] && jobs=4
            v=$(_fs_bench_fio 48 "$d" --name=fs --rw=randwrite --bs=4k --size="${FS_BENCH_SYNC_SIZE:-64M}" \
                --numjobs="$jobs" --fsync=1 --time_based --runtime="${FS_BENCH_SYNC_RUNTIME:-10}" --filename_format="$sync")
            rm -f "$d"/fsb-sync.* ;;
        files-create) v=$(_fs_bench_time _fs_bench_create_files "$d/fsb-files" "${FS_BENCH_FILES:-5000}") ;;
        files-delete) v=$(_fs_bench_time rm -rf "$d/fsb-files") ;;
        tree-unpack)
            [[ -f ${FS_BENCH_TREE:-} ]] || { echo "fs-workloads: FS_BENCH_TREE (${FS_BENCH_TREE:-unset}) is not a file" >&2; return 1; }
            mkdir "$d/fsb-a"
            cat "$FS_BENCH_TREE" >/dev/null
            v=$(_fs_bench_time _fs_bench_untar "$FS_BENCH_TREE" "$d/fsb-a") ;;
        tree-copy) v=$(_fs_bench_time cp -a "$d/fsb-a" "$d/fsb-b") ;;
        tree-grep) v=$(_fs_bench_time _fs_bench_grep "${FS_BENCH_GREP:-MODULE_LICENSE}" "$d/fsb-a") ;;
        tree-md5) v=$(_fs_bench_time _fs_bench_md5 "$d/fsb-a") ;;
        tree-remove) v=$(_fs_bench_time rm -rf "$d/fsb-a" "$d/fsb-b") ;;
        stream-rand)
            local ssize=${FS_BENCH_STREAM_SIZE:-128M}
            _fs_bench_fio 48 "$d" --name=ss --rw=write --bs=1M --size="$ssize" --end_fsync=1 --filename=fsb-stream >/dev/null &&
                fs_bench_drop &&
                v=$(_fs_bench_fio_iops "$d" --name=sr --rw=randwrite --bs=4k --size="$ssize" --fdatasync=8 \
                    --time_based --runtime="${FS_BENCH_STREAM_RUNTIME:-20}" --filename=fsb-stream)
            rm -f "$d/fsb-stream" ;;
        bufwrite)
            v=$(_fs_bench_fio 48 "$d" --name=bw --rw=randwrite --bs=4k --size="$rsize" --time_based --runtime="$rt" --filename=fsb-buf)
            rm -f "$d/fsb-buf" ;;
        files4k-create) v=$(_fs_bench_time _fs_bench_create_4k "$d/fsb-files4k" "${FS_BENCH_FILES:-5000}") ;;
        files4k-delete) v=$(_fs_bench_time rm -rf "$d/fsb-files4k") ;;
        dev-copy)
            [[ -f ${FS_BENCH_TREE:-} ]] || { echo "fs-workloads: FS_BENCH_TREE (${FS_BENCH_TREE:-unset}) is not a file" >&2; return 1; }
            local src
            src=$(_fs_bench_dev_src) || return 1
            tar -cf - -C "$src" . >/dev/null
            v=$(_fs_bench_time cp -r "$src" "$d/fsb-dev") ;;
        dev-commit)
            _fs_bench_git init -q "$d/fsb-dev" || return 1
            v=$(_fs_bench_time _fs_bench_git_commit_all "$d/fsb-dev" tree) ;;
        dev-status) v=$(_fs_bench_time _fs_bench_git_status "$d/fsb-dev") ;;
        dev-grep) v=$(_fs_bench_time _fs_bench_grep "${FS_BENCH_GREP:-MODULE_LICENSE}" "$d/fsb-dev" --exclude-dir=.git) ;;
        dev-edit)
            local list n step
            list=$(mktemp)
            _fs_bench_git -C "$d/fsb-dev" ls-files >"$list.all" || { rm -f "$list" "$list.all"; return 1; }
            n=$(wc -l <"$list.all")
            step=$((n / ${FS_BENCH_DEV_EDITS:-200}))
            ((step >= 1)) || step=1
            awk -v s="$step" -v m="${FS_BENCH_DEV_EDITS:-200}" 'NR % s == 0 && k < m {print; k++}' "$list.all" >"$list"
            v=$(_fs_bench_time _fs_bench_edit "$d/fsb-dev" "$list")
            rm -f "$list" "$list.all" ;;
        dev-remove) v=$(_fs_bench_time rm -rf "$d/fsb-dev") ;;
        *) echo "fs-workloads: unknown phase $phase" >&2; return 1 ;;
    esac
    # (errexit is off when the caller tests this function, hence the check)
    [[ -n ${v:-} ]] || { echo "fs-workloads: $phase failed in $d" >&2; return 1; }
    case $phase in
        files-* | files4k-* | tree-* | dev-*) printf '%s\t%s\ts\tlower\n' "$phase" "$v" ;;
        stream-rand) printf '%s\t%s\tIOPS\thigher\n' "$phase" "$v" ;;
        *) printf '%s\t%s\tMB/s\thigher\n' "$phase" "$v" ;;
    esac
}

# fs_workloads DIR: every selected phase in order (see fs_bench_phases).
fs_workloads() {
    local d=$1 phase
    for phase in $(fs_bench_phases); do
        echo "fs-workloads: $phase in $d" >&2
        fs_bench_phase "$d" "$phase" || return 1
    done
}

# The kernel directories of the "subset" tree: 10,615 files, 124 MiB of linux-source-6.1.
FS_BENCH_SUBSET_DIRS=(fs include kernel mm net)

# fs_bench_prepare_tree TREE CACHE: the source tree of the tree phases as an
# uncompressed .tar, so that unpacking measures the file system, not xz.
# "subset" (FS_BENCH_SUBSET_DIRS) and "full" are cut from Debian's
# /usr/src/linux-source-6.1.tar.xz once and kept in CACHE; anything else is
# the path of a .tar. Exports FS_BENCH_TREE; sets FS_BENCH_TREE_DESC (source,
# file count and size). Returns 2 if TREE is neither a kind nor a file.
fs_bench_prepare_tree() {
    local tree=$1 cache=$2 src=/usr/src/linux-source-6.1.tar.xz tar_path stage
    case $tree in
        subset | full)
            mkdir -p "$cache"
            if [[ $tree == subset ]]; then
                tar_path="$cache/linux-source-6.1-$(IFS=-; echo "${FS_BENCH_SUBSET_DIRS[*]}").tar"
            else
                tar_path="$cache/linux-source-6.1.tar"
            fi
            if [[ ! -s $tar_path || $tar_path -ot $src ]]; then
                echo "== extracting the tree into $tar_path" >&2
                # Private names: two benchmarks may prepare the same tree at once.
                stage="$cache/stage.$$"
                rm -rf "$stage" "$tar_path.$$"
                if [[ $tree == full ]]; then
                    xz -dc "$src" >"$tar_path.$$"
                else
                    mkdir -p "$stage"
                    xz -dc "$src" | tar -xf - -C "$stage" "${FS_BENCH_SUBSET_DIRS[@]/#/linux-source-6.1/}"
                    tar -cf "$tar_path.$$" -C "$stage" linux-source-6.1
                    rm -rf "$stage"
                fi
                mv "$tar_path.$$" "$tar_path"
            fi
            FS_BENCH_TREE_DESC="Debian linux-source-6.1 ($(dpkg-query -W -f='${Version}' linux-source-6.1))"
            [[ $tree == subset ]] && FS_BENCH_TREE_DESC+=", directories ${FS_BENCH_SUBSET_DIRS[*]}"
            ;;
        *)
            [[ -f $tree ]] || { echo "fs-workloads: tree $tree: no such file" >&2; return 2; }
            tar_path=$(realpath "$tree")
            FS_BENCH_TREE_DESC=$tar_path
            ;;
    esac
    export FS_BENCH_TREE=$tar_path
    # where the dev-* phases unpack it once (kept with the cache)
    export FS_BENCH_TREE_DIR="$cache/$(basename "$tar_path" .tar).d"
    FS_BENCH_TREE_DESC+=": $(tar -tvf "$tar_path" | awk '$1 ~ /^-/ {n++; b += $3} END {printf "%d files, %.0f MiB", n, b / 1048576}')"
}
