//! What resolving or attaching a probe tells the user besides errors: one line each.

use std::fmt;
use std::path::PathBuf;

/// Something a user should know about a probe that did attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The probed file is not mapped by the process the probe is for: it fires only if
    /// that process or a child maps it later (dlopen, exec).
    NotMapped {
        probe: String,
        path: PathBuf,
        pid: u32,
        /// The process maps no shared library at all (a static executable).
        static_target: bool,
    },
}

impl Notice {
    /// `warning` for a probe that may count nothing, `note` otherwise.
    pub fn level(&self) -> &'static str {
        match self {
            Notice::NotMapped { .. } => "warning",
        }
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::NotMapped {
                probe,
                path,
                pid,
                static_target,
            } => write!(
                f,
                "{probe} may never fire: process {pid} does not map {}{}; it counts only \
                 calls made after the process or a child maps it (dlopen, exec)",
                path.display(),
                if *static_target {
                    " (it is statically linked)"
                } else {
                    ""
                }
            ),
        }
    }
}
