//! Output files: checked before anything starts, written at the end without following
//! anything another user could have planted.
//!
//! cargo-trace runs as root, often in a directory other users can write to (or one the
//! sudo user owns). So an output is never opened by its path at the end of the run:
//! [`Destination::open`] checks the path when the session starts (its directory exists and
//! takes a new file, is not reached through a link another user owns and, under sudo, is
//! one the sudo user may write to; the path is not a directory or a special file such as
//! `/dev/full`), keeps the directory open, and [`Destination::write`] creates a file with a random name
//! in that directory exclusively, fills it, gives it to the user the run works for
//! ([`crate::invoker`]) and renames it over the path: a link found there is replaced, never
//! followed, and readers see the old file or the new one, whole.
//!
//! A failed write at the end does not stop the others: [`Written`] collects what was
//! written and what failed, for one closing error that still tells the target's fate.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use unwind_tables::cache::Owner;

/// Outputs are readable by all, like the files a user's shell would create.
const MODE: u32 = 0o644;

/// An output file checked at the start of the session.
#[derive(Debug)]
pub struct Destination {
    path: PathBuf,
    /// What the file holds, for messages ("flamegraph").
    what: &'static str,
    /// The directory the path named when it was checked.
    dir: File,
    name: std::ffi::OsString,
}

impl Destination {
    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that `path` can take the output `what`, and keeps its directory open.
    pub fn open(path: &Path, what: &'static str) -> Result<Destination> {
        let shown = path.display();
        let Some(name) = path.file_name().filter(|_| !path.ends_with("..")) else {
            bail!("the {what} path {shown} names a directory, not a file");
        };
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let owner = crate::invoker::owner();
        if let Some(link) = foreign_link(parent, owner) {
            bail!(
                "the {what} cannot go in {}: {} is a link another user owns",
                parent.display(),
                link.display()
            );
        }
        let dir = File::open(parent)
            .with_context(|| format!("the {what} cannot go in {}", parent.display()))?;
        let metadata = dir.metadata()?;
        if !metadata.is_dir() {
            bail!(
                "the {what} cannot go in {}: not a directory",
                parent.display()
            );
        }
        // Root writes for the sudo user only where that user may write.
        if crate::invoker::sudo_user().is_some() && !may_write(&metadata, owner) {
            bail!(
                "the {what} cannot go in {}: under sudo, outputs go where user {} may write",
                parent.display(),
                owner.uid
            );
        }
        let destination = Destination {
            path: path.to_path_buf(),
            what,
            dir,
            name: name.to_owned(),
        };
        // What is there now: replaced at the end, unless it is something no file should
        // replace. A link is judged by what it points to (`/dev/stdout`).
        if let Ok(metadata) = std::fs::symlink_metadata(path) {
            let target = if metadata.is_symlink() {
                std::fs::metadata(path).ok()
            } else {
                Some(metadata)
            };
            if let Some(target) = target {
                let kind = target.file_type();
                if kind.is_dir() {
                    bail!("the {what} path {shown} is a directory");
                }
                if kind.is_char_device()
                    || kind.is_block_device()
                    || kind.is_fifo()
                    || kind.is_socket()
                {
                    bail!("the {what} path {shown} is not a regular file");
                }
            }
        }
        // Whether a file can be created there (root passes permission checks, not
        // read-only file systems or /proc): the real thing, removed at once.
        destination
            .temporary()
            .with_context(|| format!("cannot write the {what} to {shown}"))?;
        Ok(destination)
    }

    /// Replaces the file with `bytes`.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        let mut temp = self.temporary().with_context(|| {
            format!("cannot write the {} to {}", self.what, self.path.display())
        })?;
        let written = temp
            .write_all(bytes)
            .and_then(|()| temp.as_file().set_permissions(Permissions::from_mode(MODE)))
            .and_then(|()| {
                let owner = crate::invoker::owner();
                let file = temp.as_file();
                let metadata = file.metadata()?;
                if (metadata.uid(), metadata.gid()) == (owner.uid, owner.gid) {
                    return Ok(());
                }
                std::os::unix::fs::fchown(file, Some(owner.uid), Some(owner.gid))
            })
            .and_then(|()| {
                temp.persist(self.in_dir(&self.name))
                    .map(drop)
                    .map_err(|error| error.error)
            });
        written.with_context(|| format!("writing the {} to {}", self.what, self.path.display()))
    }

    /// A new file with a random name in the directory, created exclusively, removed
    /// when dropped.
    fn temporary(&self) -> std::io::Result<tempfile::NamedTempFile> {
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(&self.name);
        prefix.push(".");
        tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempfile_in(self.in_dir(""))
            // tempfile names the path it tried, here /proc/self/fd/N/.NAME.RANDOM.tmp, which
            // says nothing to a user: the system's message alone.
            .map_err(|error| {
                let message = error.to_string();
                let message = message.split(" at path ").next().unwrap_or_default();
                std::io::Error::new(error.kind(), message.to_string())
            })
    }

    /// `name` in the directory that was checked, whatever its path names by now.
    fn in_dir(&self, name: impl AsRef<Path>) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd())).join(name)
    }

    /// Whether two destinations are the same file.
    fn same_as(&self, other: &Destination) -> bool {
        let id = |dir: &File| dir.metadata().map(|m| (m.dev(), m.ino())).ok();
        self.name == other.name && id(&self.dir) == id(&other.dir)
    }
}

/// The first link on the way to directory `dir` (as written) owned by someone other than
/// root or `owner`: a path through it goes where that user decides.
fn foreign_link(dir: &Path, owner: Owner) -> Option<PathBuf> {
    let mut prefix = PathBuf::new();
    for component in dir.components() {
        prefix.push(component);
        let metadata = std::fs::symlink_metadata(&prefix).ok()?;
        if metadata.is_symlink() && metadata.uid() != 0 && metadata.uid() != owner.uid {
            return Some(prefix);
        }
    }
    None
}

/// Whether `owner` may create files in the directory `metadata` describes, by its mode
/// bits (an ACL that grants more is not consulted: refused rather than guessed).
fn may_write(metadata: &std::fs::Metadata, owner: Owner) -> bool {
    let mode = metadata.mode();
    if metadata.uid() == owner.uid {
        return mode & 0o300 == 0o300;
    }
    if crate::invoker::groups(owner).contains(&metadata.gid()) {
        return mode & 0o030 == 0o030;
    }
    mode & 0o003 == 0o003
}

/// Opens every output asked for (`None`: not asked for), in order, refusing two that
/// name the same file.
pub fn open_all(outputs: &[(Option<&Path>, &'static str)]) -> Result<Vec<Option<Destination>>> {
    let mut opened: Vec<Option<Destination>> = Vec::with_capacity(outputs.len());
    for &(path, what) in outputs {
        let Some(path) = path else {
            opened.push(None);
            continue;
        };
        let destination = Destination::open(path, what)?;
        if let Some(earlier) = opened.iter().flatten().find(|d| d.same_as(&destination)) {
            bail!(
                "the {} and the {} would both be written to {}",
                earlier.what,
                what,
                path.display()
            );
        }
        opened.push(Some(destination));
    }
    Ok(opened)
}

/// What the end of a session wrote, and what it could not.
#[derive(Debug, Default)]
pub struct Written {
    written: Vec<PathBuf>,
    failed: Vec<String>,
}

impl Written {
    /// Writes what `render` gives to `destination`, remembering either outcome.
    pub fn write(&mut self, destination: &Destination, render: impl FnOnce() -> Result<Vec<u8>>) {
        match render().and_then(|bytes| destination.write(&bytes)) {
            Ok(()) => self.written.push(destination.path.clone()),
            Err(error) => self.failed.push(format!("{error:#}")),
        }
    }

    /// Whether the output at `path` was written.
    pub fn contains(&self, path: &Path) -> bool {
        self.written.iter().any(|written| written == path)
    }

    /// The line naming what was written, if anything was.
    pub fn summary(&self) -> Option<String> {
        (!self.written.is_empty()).then(|| {
            let paths: Vec<String> = self
                .written
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!("cargo-trace: wrote {}", paths.join(", "))
        })
    }

    /// An error naming every failed write and how the target ended (`target`, e.g.
    /// "the target exited with code 0"), if a write failed.
    pub fn check(&self, target: &str) -> Result<()> {
        if self.failed.is_empty() {
            return Ok(());
        }
        bail!("{}; {target}", self.failed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.svg");
        let regular = dir.path().join("regular");
        std::fs::write(&regular, "").unwrap();
        let cases: &[(&Path, &str)] = &[
            (Path::new("/nonexistent/x.svg"), "/nonexistent"),
            (dir.path(), "directory"),
            (Path::new("/dev/full"), "not a regular file"),
            (Path::new("/proc/x.svg"), "cannot write"),
            (&regular.join("x.svg"), "not a directory"),
        ];
        for (path, message) in cases {
            let error = Destination::open(path, "flamegraph").unwrap_err();
            let text = format!("{error:#}");
            assert!(text.contains(message), "{}: {text}", path.display());
        }
        let error =
            open_all(&[(Some(&file), "flamegraph"), (Some(&file), "folded stacks")]).unwrap_err();
        assert!(error.to_string().contains("both"), "{error}");
        // The checks left nothing behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_link_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("out.svg");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let destination = Destination::open(&path, "flamegraph").unwrap();
        destination.write(b"<svg/>").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        assert!(metadata.is_file());
        assert_eq!(metadata.mode() & 0o777, MODE);
        assert_eq!(std::fs::read(&path).unwrap(), b"<svg/>");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_failed_write_is_reported_with_the_target_and_others_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let outputs = open_all(&[
            (Some(&gone.join("out.svg")), "flamegraph"),
            (None, "pprof"),
            (Some(&dir.path().join("out.folded")), "folded stacks"),
        ])
        .unwrap();
        std::fs::remove_dir(&gone).unwrap();
        let mut written = Written::default();
        for destination in outputs.iter().flatten() {
            written.write(destination, || Ok(b"data".to_vec()));
        }
        let summary = written.summary().unwrap();
        assert!(summary.contains("out.folded") && !summary.contains("out.svg"));
        let error = written.check("the target exited with code 3").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("flamegraph") && text.contains("exited with code 3"),
            "{text}"
        );
        assert_eq!(
            std::fs::read(dir.path().join("out.folded")).unwrap(),
            b"data"
        );
    }
}
