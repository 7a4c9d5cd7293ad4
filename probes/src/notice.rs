//! What resolving or attaching a probe tells the user besides errors: one line each.

use std::fmt;
use std::path::PathBuf;

use crate::instructions::HazardKind;

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
    /// An IFUNC symbol: the implementations probed in place of its resolver, which
    /// runs once per process.
    Ifunc {
        symbol: String,
        path: PathBuf,
        /// Empty: none was found, and the resolver itself is probed.
        implementations: Vec<String>,
        /// The process whose selection was read; `None`: every implementation the
        /// resolver can select is probed.
        selected_in: Option<u32>,
    },
    /// Several IFUNCs matched by one pattern: their [`Notice::Ifunc`]s, said in one
    /// line.
    Ifuncs {
        pattern: String,
        path: PathBuf,
        ifuncs: Vec<Notice>,
    },
    /// Functions whose first instruction no uprobe may sit on, all for one reason
    /// (`kind`), probed at their second instruction: (function, first instruction,
    /// offset of the second).
    PastHazard {
        path: PathBuf,
        kind: HazardKind,
        moved: Vec<(String, String, u64)>,
    },
    /// Functions matching a pattern left unprobed: they start with an instruction no
    /// uprobe may sit on (for `kind`'s reason), and their second instruction will not
    /// do either.
    SkippedHazard {
        pattern: String,
        path: PathBuf,
        kind: HazardKind,
        functions: Vec<String>,
    },
}

/// How many IFUNCs or functions a [`Notice::Ifuncs`] or
/// [`Notice::PastHazard`] line names.
const LISTED: usize = 5;

impl Notice {
    /// `warning` for a probe that may count nothing, `note` otherwise.
    pub fn level(&self) -> &'static str {
        match self {
            Notice::NotMapped { .. } | Notice::SkippedHazard { .. } => "warning",
            Notice::Ifunc {
                implementations, ..
            } if implementations.is_empty() => "warning",
            Notice::Ifunc { .. } | Notice::PastHazard { .. } => "note",
            Notice::Ifuncs { ifuncs, .. } => {
                if ifuncs.iter().any(|n| n.level() == "warning") {
                    "warning"
                } else {
                    "note"
                }
            }
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
            Notice::Ifunc {
                symbol,
                path,
                implementations,
                selected_in,
            } => {
                write!(f, "{symbol} in {} is an IFUNC: ", path.display())?;
                match (implementations.as_slice(), selected_in) {
                    ([], _) => write!(
                        f,
                        "no implementation found; probing its resolver, which runs once \
                         per process (probe an implementation by name instead)"
                    ),
                    ([one], Some(pid)) => {
                        write!(f, "probing {one}, the implementation process {pid} uses")
                    }
                    (all, _) => write!(
                        f,
                        "probing the {} implementations its resolver can select: {}",
                        all.len(),
                        all.join(", ")
                    ),
                }
            }
            Notice::Ifuncs {
                pattern,
                path,
                ifuncs,
            } => {
                let mut listed = Vec::new();
                let mut unresolved = 0;
                for notice in ifuncs {
                    if let Notice::Ifunc {
                        symbol,
                        implementations,
                        ..
                    } = notice
                    {
                        match implementations.as_slice() {
                            [] => unresolved += 1,
                            [one] => listed.push(format!("{symbol} -> {one}")),
                            all => {
                                listed.push(format!("{symbol} -> {} implementations", all.len()))
                            }
                        }
                    }
                }
                let shown = listed.len().min(LISTED);
                write!(
                    f,
                    "{} functions matching '{pattern}' in {} are IFUNCs, probed at their \
                     implementations instead: {}{}",
                    ifuncs.len(),
                    path.display(),
                    listed[..shown].join(", "),
                    if listed.len() > shown { ", ..." } else { "" }
                )?;
                if unresolved > 0 {
                    write!(
                        f,
                        "; {unresolved} at their resolvers (no implementation found), \
                         which run once per process"
                    )?;
                }
                Ok(())
            }
            Notice::PastHazard { path, kind, moved } => {
                let why = kind.why();
                match moved.as_slice() {
                    [(function, instruction, offset)] => write!(
                        f,
                        "{function} in {} starts with {instruction}, {why}: probing its \
                         next instruction, {function}+{offset:#x}, reached once per call",
                        path.display()
                    ),
                    all => {
                        let shown: Vec<String> = all
                            .iter()
                            .take(LISTED)
                            .map(|(function, _, offset)| format!("{function}+{offset:#x}"))
                            .collect();
                        write!(
                            f,
                            "{} functions in {} start with {why}: probing each at its next \
                             instruction, reached once per call: {}{}",
                            all.len(),
                            path.display(),
                            shown.join(", "),
                            if all.len() > LISTED { ", ..." } else { "" }
                        )
                    }
                }
            }
            Notice::SkippedHazard {
                pattern,
                path,
                kind,
                functions,
            } => write!(
                f,
                "{} functions matching '{pattern}' in {} are not probed: they start with {}, \
                 and their next instruction cannot stand for their entry: {}{}",
                functions.len(),
                path.display(),
                kind.why(),
                functions[..functions.len().min(LISTED)].join(", "),
                if functions.len() > LISTED {
                    ", ..."
                } else {
                    ""
                }
            ),
        }
    }
}
