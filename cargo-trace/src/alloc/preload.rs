//! The preloaded library: where a launched target's libc allocator is probed by default.
//!
//! Probing libc's malloc and free costs three kernel events per pair: a breakpoint at
//! malloc's entry, its return probe and a breakpoint at free's entry. A target that
//! cargo-trace launches runs instead with `libcargo-trace-preload.so` in `LD_PRELOAD`
//! (the `preload` crate's `c/preload.c`, built into this binary): its malloc and the rest call the next
//! definition (libc's) and then a site, a function that starts with a nop, whose
//! breakpoint the kernel emulates. The programs attached there (`on_preload_*` in
//! `alloc.bpf.h`) count what the probes of libc's functions would, with no return probe;
//! the stacks start at the library's wrapper, which is named as the function it wraps.
//! Where every call is counted ([`Preload::environment`]), the library logs each
//! thread's frees of small blocks and the kernel takes the log with the thread's next
//! allocation (`struct ct_free_log`): one event per malloc/free pair. The log's last
//! frees are taken at the thread's exit and exec too
//! ([`EventProgram::ThreadExit`](bpf_prog::EventProgram::ThreadExit),
//! [`EventProgram::ThreadExec`](bpf_prog::EventProgram::ThreadExec)). Where the
//! executable or a library it maps brings an allocator that replaces malloc (jemalloc,
//! mimalloc), that one is probed, and libc's functions as without the library: the
//! wrappers call that allocator's malloc, which would count each call twice.
//!
//! A process runs with the library only if it keeps the variable and loads it: the
//! launched target is checked when it stops at its entry (else libc is probed there as
//! with `--no-preload`), and each child that execs when it stops at its start
//! ([`Missing`]): one that maps libc without the library (its environment dropped
//! `LD_PRELOAD`, or a setuid program) has its heap uncounted, and is reported.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bpf_prog::AllocKind;

use ::preload::{Site, LIBRARY};

const FILE_NAME: &str = ::preload::FILE_NAME;

/// The library's sites and the kinds they are attached as.
pub const SITES: &[(&str, AllocKind)] = &{
    let mut sites = [("", AllocKind::Allocated); ::preload::SITES.len()];
    let mut i = 0;
    while i < sites.len() {
        let (name, site) = ::preload::SITES[i];
        sites[i] = (
            name,
            match site {
                Site::Allocated => AllocKind::Allocated,
                Site::Freeing => AllocKind::Free,
                Site::Unmapping => AllocKind::Munmap,
                Site::Resizing => AllocKind::Resizing,
                Site::Resized => AllocKind::Resized,
                Site::Freed => AllocKind::Freed,
                Site::Log => AllocKind::Log,
            },
        );
        i += 1;
    }
    sites
};

/// The library written out for one session, in a directory of its own that goes with it.
pub struct Preload {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Preload {
    /// Writes the library into a new directory under `$TMPDIR` (made by this process, so
    /// no one else's file can take its place), readable by the target whoever it runs as.
    pub fn write() -> Result<Preload> {
        let dir = tempfile::Builder::new()
            .prefix("cargo-trace-preload-")
            .tempdir()
            .context("making a directory for the preloaded library")?;
        let path = dir.path().join(FILE_NAME);
        let mut file =
            std::fs::File::create(&path).with_context(|| format!("writing {}", path.display()))?;
        file.write_all(LIBRARY)
            .with_context(|| format!("writing {}", path.display()))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        Ok(Preload { _dir: dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `LD_PRELOAD` for the target: the library first, then what the variable held.
    pub fn ld_preload(&self, existing: Option<OsString>) -> OsString {
        let mut value = self.path.as_os_str().to_os_string();
        if let Some(existing) = existing.filter(|e| !e.is_empty()) {
            value.push(":");
            value.push(existing);
        }
        value
    }

    /// The target's environment for the library: `LD_PRELOAD` with it, and whether it logs
    /// the frees (`log_frees`: where every call is counted; sampling asks the kernel to
    /// leave most out as they come, which a log told later would not let it).
    pub fn environment(
        &self,
        existing: Option<OsString>,
        log_frees: bool,
    ) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.ld_preload(existing)),
            (
                "CARGO_TRACE_FREE_LOG",
                if log_frees { "1" } else { "0" }.into(),
            ),
        ]
    }

    /// Whether process `pid` maps the library (it kept `LD_PRELOAD` and ld.so loaded it).
    pub fn mapped_in(&self, pid: u32) -> bool {
        process_image::mapped_files(pid).is_ok_and(|files| self.among(&files))
    }

    fn among(&self, files: &[PathBuf]) -> bool {
        files.iter().any(|file| same_file(file, &self.path))
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => a == b,
    }
}

/// Whether `files` hold a libc, whose allocator the library would have wrapped.
fn has_libc(files: &[PathBuf]) -> bool {
    files.iter().any(|file| {
        file.file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-"))
    })
}

/// The processes that ran with libc but without the library: their heap is not counted.
#[derive(Default)]
pub struct Missing {
    count: u64,
    /// The first one's pid and command line.
    first: Option<(u32, String)>,
}

impl Missing {
    /// Checks process `pid`, stopped at its start after an exec.
    pub fn check(&mut self, preload: &Preload, pid: u32) {
        let Ok(files) = process_image::mapped_files(pid) else {
            return; // gone already
        };
        if preload.among(&files) || !has_libc(&files) {
            return;
        }
        self.count += 1;
        if self.first.is_none() {
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    raw.split(|&b| b == 0)
                        .filter(|arg| !arg.is_empty())
                        .map(|arg| String::from_utf8_lossy(arg).into_owned())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            self.first = Some((pid, command));
        }
    }

    /// The one line that says so, if any process ran without the library.
    pub fn warning(&self) -> Option<String> {
        let (pid, command) = self.first.as_ref()?;
        let processes = match self.count {
            1 => "1 process".to_string(),
            n => format!("{n} processes, the first"),
        };
        Some(format!(
            "{processes} (pid {pid}: {command}) ran without cargo-trace's preloaded library \
             (its environment dropped LD_PRELOAD, or it is setuid): its heap is not counted; \
             --no-preload probes libc itself in every process"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_goes_first_in_ld_preload() {
        let preload = Preload::write().unwrap();
        let path = preload.path().display().to_string();
        assert_eq!(preload.ld_preload(None), OsString::from(&path));
        assert_eq!(preload.ld_preload(Some("".into())), OsString::from(&path));
        assert_eq!(
            preload.ld_preload(Some("/lib/other.so".into())),
            OsString::from(format!("{path}:/lib/other.so"))
        );
        let written = std::fs::read(preload.path()).unwrap();
        assert_eq!(written, LIBRARY);
        let dir = preload.path().parent().unwrap().to_path_buf();
        drop(preload);
        assert!(!dir.exists(), "the directory goes with the session");
    }

    /// The library is loaded by a process that keeps the variable, and its wrappers
    /// return working memory; this test process maps libc without it: it is missing.
    #[test]
    fn a_process_is_missing_the_library_when_it_maps_libc_alone() {
        let preload = Preload::write().unwrap();
        let with = std::process::Command::new("/bin/sh")
            .args(["-c", "exec sleep 5"])
            .env("LD_PRELOAD", preload.ld_preload(None))
            .spawn()
            .unwrap();
        let mut with = Reaped(with);
        let pid = with.0.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !preload.mapped_in(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(preload.mapped_in(pid), "sleep did not load the library");
        let mut missing = Missing::default();
        missing.check(&preload, pid);
        assert_eq!(missing.warning(), None);
        let _ = with.0.kill();

        let me = std::process::id();
        missing.check(&preload, me);
        missing.check(&preload, me);
        let warning = missing.warning().unwrap();
        assert!(
            warning.starts_with(&format!("2 processes, the first (pid {me}: ")),
            "{warning}"
        );
        assert!(warning.contains("--no-preload"), "{warning}");
    }

    /// A child killed and reaped whatever the test does.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
