#!/usr/bin/env bash
# The whole test suite. Works on a fresh machine as root: installs the build
# prerequisites first (clang, libelf-dev, bpftool; mounts tracefs).
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/setup.sh
cargo test --workspace "$@"
