#!/usr/bin/env bash
# The main job on the bundled example: build cargo-trace, let it build the
# `demo` package (examples/demo; release, no frame pointers), sample it at 99 Hz with stacks
# unwound in the kernel, and write flamegraph.svg in the current directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

bash "$root/.ci/setup.sh"
cargo build --release --manifest-path "$root/Cargo.toml" -p cargo-trace
"$root/target/release/cargo-trace" profile:hz:99 \
    --manifest-path "$root/Cargo.toml" --package cargo-trace-demo \
    -o flamegraph.svg --folded flamegraph.folded -- 3
