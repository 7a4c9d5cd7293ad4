#!/usr/bin/env bash
# Prepares a machine to build and test cargo-trace. Idempotent; run as root.
#
# A fresh machine of the project's kind has Rust, gcc, make, pkg-config and
# zlib1g-dev, but not what the BPF side needs:
#   clang       compiles bpf-prog/src/bpf/*.bpf.c (without it, bpf-prog builds
#               from its committed prebuilt object; see bpf-prog's crate docs)
#   libelf-dev  libbpf-sys builds the vendored libbpf against libelf
#   bpftool     regenerates bpf-prog/src/bpf/vmlinux.h (not needed to build)
#   golang-go   `go tool pprof`, which the tests use to read the pprof output
#   chromium    the tests open the HTML report in it, headless
#   poppler-utils  pdftotext reads what chromium printed of the report
#   firefox-esr the report's views are checked in Firefox too, headless
#   heaptrack   heaptrack_print reads the --heaptrack output in the tests; the heap
#               benchmark runs heaptrack itself
# and, from the npm registry with the machine's node and npm (`npm ci`, the versions of
# cargo-trace/tests/speedscope-app/package-lock.json), the speedscope app and
# playwright-core, which opens --speedscope files in the app in chromium in the tests
# and what the security tests use, present on Debian but not on every minimal image:
#   passwd (useradd), util-linux (setpriv), perl-base (perl)
# apt-get update runs only when a package is missing, so a prepared machine
# does no network access at all.
#
# It also mounts tracefs (attaching a tracepoint reads its event id there, and
# libbpf falls back to it for uprobes on kernels without the uprobe PMU) and
# debugfs (older tools look for tracing under it).
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "setup.sh: must run as root (installs packages, mounts tracefs)" >&2
    exit 1
fi

# package -> a file it installs
declare -A wanted=(
    [libelf-dev]=/usr/include/libelf.h
    [zlib1g-dev]=/usr/include/zlib.h
    [make]=/usr/bin/make
    [pkg-config]=/usr/bin/pkg-config
    [bpftool]=/usr/sbin/bpftool
    # debug info for libc: symbolized frames inside libc, .debug_frame fallback
    [libc6-dbg]=/usr/share/doc/libc6-dbg/copyright
    # go tool pprof: the tests read the pprof output with the real client
    [golang-go]=/usr/bin/go
    # headless chromium opens the HTML report in the tests, with a font to draw it
    [chromium]=/usr/bin/chromium
    [fonts-dejavu-core]=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
    # pdftotext reads the report as chromium printed it (every flamegraph drawn)
    [poppler-utils]=/usr/bin/pdftotext
    # the report's views are drawn and used in headless Firefox too
    [firefox-esr]=/usr/bin/firefox-esr
    # the security tests create an unprivileged user (useradd) and act as it (setpriv)
    [passwd]=/usr/sbin/useradd
    [util-linux]=/usr/bin/setpriv
    # script(1) gives the progress-line test a terminal
    [bsdutils]=/usr/bin/script
    [perl-base]=/usr/bin/perl
    # the heap profiler's fixtures: jemalloc (linked statically, as tikv-jemallocator
    # links it) and mimalloc. The Rust fixture crate tests/fixtures/alloc_crates gets
    # tikv-jemallocator and mimalloc from crates.io and builds their C with gcc, and
    # jemalloc's configure script with sh and make
    [libjemalloc-dev]=/usr/include/jemalloc/jemalloc.h
    [libmimalloc-dev]=/usr/include/mimalloc.h
    # heaptrack_print reads the heaptrack export; the heap benchmark compares with heaptrack
    [heaptrack]=/usr/bin/heaptrack_print
)

missing=()
for package in "${!wanted[@]}"; do
    if [[ ! -e ${wanted[$package]} ]]; then
        missing+=("$package")
    fi
done

# Any clang will do: bpf-prog's build.rs looks for $BPF_CLANG, clang, then
# clang-19..clang-14.
have_clang=no
for compiler in "${BPF_CLANG:-clang}" clang clang-{19,18,17,16,15,14}; do
    if command -v "$compiler" >/dev/null; then
        have_clang=yes
        break
    fi
done
if [[ $have_clang == no ]]; then
    missing+=(clang)
fi

if ((${#missing[@]} > 0)); then
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The speedscope app and its driver, once per change of the lock file.
app=$(cd "$(dirname "$0")/.." && pwd)/cargo-trace/tests/speedscope-app
if [[ ! $app/node_modules/.package-lock.json -nt $app/package-lock.json ]]; then
    if ! command -v npm >/dev/null; then
        echo "setup.sh: installing nodejs npm"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    fi
    echo "setup.sh: installing the speedscope app (npm ci in $app)"
    npm ci --prefix "$app" --no-audit --no-fund --loglevel=error >/dev/null
fi

mount_if_absent() {
    local fstype=$1 target=$2
    if [[ -d $target ]] && ! mountpoint -q "$target"; then
        mount -t "$fstype" nodev "$target" ||
            echo "setup.sh: could not mount $fstype at $target (continuing)" >&2
    fi
}

mount_if_absent tracefs /sys/kernel/tracing
mount_if_absent debugfs /sys/kernel/debug
exit 0
