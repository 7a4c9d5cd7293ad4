//! Finding the file a spec names: a path, a library short name, a program on `PATH`,
//! or a process's executable, seen through the process's mount namespace.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::ResolveError;

/// Finds the binary a spec names.
///
/// - A name with a `/` is a path (relative to the current directory, or absolute and
///   then seen through `pid`'s mount namespace).
/// - A library name (`libc`, `libc.so.6`, `libpthread`): the file of that name mapped
///   by `pid`, else one in `LD_LIBRARY_PATH` or the system's library directories.
///   `libNAME` matches `libNAME.so`, `libNAME.so.*` and `libNAME-VERSION.so`.
/// - Any other name: a file in the current directory, else a program on `PATH`.
pub fn resolve_binary(target: &str, pid: Option<u32>) -> Result<PathBuf, ResolveError> {
    if target.contains('/') {
        let path = Path::new(target);
        let path = match pid {
            Some(pid) if path.is_absolute() => in_mount_namespace_of(pid, path),
            _ => path.to_path_buf(),
        };
        return existing_file(path);
    }
    let local = Path::new(".").join(target);
    if looks_like_library(target) {
        match find_library(target, pid) {
            Ok(path) => return Ok(path),
            Err(_) if local.is_file() => return existing_file(local),
            Err(e) => return Err(e),
        }
    }
    if local.is_file() {
        return existing_file(local);
    }
    if let Some(program) = find_on_path(target) {
        return existing_file(program);
    }
    Err(ResolveError::ProgramNotFound {
        name: target.to_string(),
    })
}

pub(super) fn existing_file(path: PathBuf) -> Result<PathBuf, ResolveError> {
    match fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(ResolveError::Io {
                source: io::Error::other("not a regular file"),
                path,
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ResolveError::FileNotFound { path })
        }
        Err(source) => return Err(ResolveError::Io { path, source }),
    }
    // Through /proc/PID/root the link must stay unresolved: resolving it would leave
    // the other namespace.
    if path.starts_with("/proc") {
        return Ok(path);
    }
    Ok(fs::canonicalize(&path).unwrap_or(path))
}

pub(super) fn looks_like_library(name: &str) -> bool {
    name.starts_with("lib") || name.contains(".so")
}

/// Whether a file name is the library `query` names (see [`resolve_binary`]).
pub(crate) fn library_matches(query: &str, file_name: &str) -> bool {
    if file_name == query {
        return true;
    }
    if query.contains(".so") {
        return file_name
            .strip_prefix(query)
            .is_some_and(|rest| rest.starts_with('.'));
    }
    let Some(rest) = file_name.strip_prefix(query) else {
        return false;
    };
    rest == ".so"
        || rest.starts_with(".so.")
        || (rest.starts_with('-')
            && rest[1..].starts_with(|c: char| c.is_ascii_digit())
            && (rest.ends_with(".so") || rest.contains(".so.")))
}

/// Orders matching library files: the exact name, then sonames (`libc.so.6`), then
/// versioned names (`libc-2.31.so`), then the development link (`libc.so`, which may be
/// a linker script).
pub(super) fn library_rank(query: &str, file_name: &str) -> (u8, usize, String) {
    let class = if file_name == query {
        0
    } else if file_name.contains(".so.") {
        1
    } else if file_name.contains('-') {
        2
    } else {
        3
    };
    (class, file_name.len(), file_name.to_string())
}

fn library_dirs() -> Vec<PathBuf> {
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default();
    for dir in [
        format!("/lib/{multiarch}"),
        format!("/usr/lib/{multiarch}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
        "/usr/local/lib".into(),
    ] {
        dirs.push(PathBuf::from(dir));
    }
    // On merged-/usr systems /lib is /usr/lib: search each directory once.
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(fs::canonicalize(d).unwrap_or_else(|_| d.clone())));
    dirs
}

pub(super) fn find_library(name: &str, pid: Option<u32>) -> Result<PathBuf, ResolveError> {
    let mut searched = Vec::new();
    if let Some(pid) = pid {
        searched.push(format!("/proc/{pid}/maps"));
        for path in mapped_files(pid)? {
            let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if library_matches(name, file_name) {
                return existing_file(in_mount_namespace_of(pid, &path));
            }
        }
    }
    for dir in library_dirs() {
        searched.push(dir.display().to_string());
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let best = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|file_name| library_matches(name, file_name))
            .filter(|file_name| is_elf(&dir.join(file_name)))
            .min_by_key(|file_name| library_rank(name, file_name));
        if let Some(file_name) = best {
            return existing_file(dir.join(file_name));
        }
    }
    Err(ResolveError::LibraryNotFound {
        name: name.to_string(),
        searched: searched.join(", "),
    })
}

pub(super) fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == object::elf::ELFMAG
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The files a process maps, in address order, each once.
fn mapped_files(pid: u32) -> Result<Vec<PathBuf>, ResolveError> {
    process_image::mapped_files(pid).map_err(|source| ResolveError::NoProcess { pid, source })
}

/// The binary of an omitted target: the executable of `pid`.
pub(super) fn process_executable(
    pid: Option<u32>,
    describe: impl FnOnce() -> (String, &'static str),
) -> Result<PathBuf, ResolveError> {
    let Some(pid) = pid else {
        let (spec, form) = describe();
        return Err(ResolveError::MissingTarget { spec, form });
    };
    let link = PathBuf::from(format!("/proc/{pid}/exe"));
    let target = fs::read_link(&link).map_err(|source| ResolveError::NoProcess { pid, source })?;
    let named = in_mount_namespace_of(pid, &target);
    // A rebuilt binary leaves the process running the deleted one; only the magic link
    // still reaches it.
    let same = match (fs::metadata(&named), fs::metadata(&link)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if same {
        existing_file(named)
    } else {
        existing_file(link)
    }
}

/// `path` as `pid` sees it: through `/proc/PID/root` when it lives in another mount
/// namespace (a container).
fn in_mount_namespace_of(pid: u32, path: &Path) -> PathBuf {
    let ours = fs::read_link("/proc/self/ns/mnt");
    let theirs = fs::read_link(format!("/proc/{pid}/ns/mnt"));
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) if ours != theirs => {
            let relative = path.strip_prefix("/").unwrap_or(path);
            Path::new(&format!("/proc/{pid}/root")).join(relative)
        }
        _ => path.to_path_buf(),
    }
}
