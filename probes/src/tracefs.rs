//! tracefs: where tracepoints are listed, and where libbpf reads their ids.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::AttachError;
use crate::suggest::closest;
use crate::sys;
use crate::wildcard::matches;

/// Where tracefs belongs.
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// Where older systems reach it, through debugfs.
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The tracefs root, if it is mounted (no side effects).
pub fn tracefs_root() -> Option<PathBuf> {
    [TRACEFS, DEBUGFS_TRACING]
        .into_iter()
        .map(PathBuf::from)
        .find(|root| root.join("events").is_dir())
}

/// The tracefs root, mounting tracefs at `/sys/kernel/tracing` if it is not mounted
/// (needs root). Tracepoints cannot be attached without it: libbpf reads their ids there.
pub fn ensure_tracefs() -> Result<PathBuf, AttachError> {
    if let Some(root) = tracefs_root() {
        return Ok(root);
    }
    let target = Path::new(TRACEFS);
    if !target.is_dir() {
        return Err(AttachError::Tracefs {
            reason: format!("{TRACEFS} does not exist (is sysfs mounted?)"),
        });
    }
    sys::mount_tracefs(target).map_err(|e| AttachError::Tracefs {
        reason: format!("it is not mounted and mounting it failed ({e})"),
    })?;
    tracefs_root().ok_or_else(|| AttachError::Tracefs {
        reason: format!("{TRACEFS}/events is missing after mounting tracefs"),
    })
}

fn subdirectories(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Checks that `category:name` is a tracepoint of this kernel.
pub(crate) fn check_tracepoint(root: &Path, category: &str, name: &str) -> Result<(), AttachError> {
    let events = root.join("events");
    if events.join(category).join(name).join("id").is_file() {
        return Ok(());
    }
    let known = |category: &str| subdirectories(&events.join(category));
    let suggestion = if events.join(category).is_dir() {
        let names = known(category);
        closest(name, names.iter().map(String::as_str)).map(|n| format!("{category}:{n}"))
    } else {
        let categories = subdirectories(&events);
        // The right name in the wrong category is the likeliest slip.
        categories
            .iter()
            .find(|c| events.join(c).join(name).is_dir())
            .map(|c| format!("{c}:{name}"))
            .or_else(|| {
                closest(category, categories.iter().map(String::as_str))
                    .filter(|c| events.join(c).join(name).is_dir())
                    .map(|c| format!("{c}:{name}"))
            })
    };
    Err(AttachError::NoTracepoint {
        category: category.to_string(),
        name: name.to_string(),
        root: root.to_path_buf(),
        suggestion,
    })
}

/// The tracepoints matching `category` and `name`, which may contain `*`; sorted.
pub fn expand_tracepoints(
    category: &str,
    name: &str,
) -> Result<Vec<(String, String)>, AttachError> {
    let root = ensure_tracefs()?;
    let events = root.join("events");
    let mut found = Vec::new();
    for c in subdirectories(&events) {
        if !matches(category, &c) {
            continue;
        }
        for n in subdirectories(&events.join(&c)) {
            if matches(name, &n) && events.join(&c).join(&n).join("id").is_file() {
                found.push((c.clone(), n));
            }
        }
    }
    if found.is_empty() {
        return Err(AttachError::NoTracepoint {
            category: category.to_string(),
            name: name.to_string(),
            root,
            suggestion: None,
        });
    }
    Ok(found)
}
