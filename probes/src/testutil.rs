//! Fixtures for the crate's tests: programs compiled from source into temporary
//! directories, and what the kernel says about a running process's mappings.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A private directory with an unpredictable name, removed when dropped.
pub(crate) struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("probes-test-{tag}-"))
            .tempdir()
            .unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Writes `source` to `DIR/NAME.EXT` and compiles it to `DIR/NAME` with `compiler`.
pub(crate) fn compile(
    compiler: &str,
    dir: &Path,
    name: &str,
    ext: &str,
    source: &str,
    args: &[&str],
) -> PathBuf {
    let src = dir.join(format!("{name}.{ext}"));
    let out = dir.join(name);
    fs::write(&src, source).unwrap();
    let output = Command::new(compiler)
        .args(args)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {args:?} {name}.{ext} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// The file and file offset that `address` of process `pid` maps, per /proc/PID/maps:
/// the kernel's own answer to what resolution computes from the ELF file.
pub(crate) fn mapped_file_offset(pid: u32, address: u64) -> (PathBuf, u64) {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for entry in process_image::parse_maps(&maps) {
        if (entry.start..entry.end).contains(&address) {
            return (
                PathBuf::from(entry.name),
                address - entry.start + entry.offset,
            );
        }
    }
    panic!("{address:#x} is not mapped in process {pid}");
}
