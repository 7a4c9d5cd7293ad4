//! The errors of this crate.

use std::io;

use crate::mappings::TableId;

/// Which fixed-size map an operation ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableMap {
    Rows,
    Pages,
    Rules,
    Tables,
}

impl TableMap {
    pub const ALL: [TableMap; 4] = [
        TableMap::Rows,
        TableMap::Pages,
        TableMap::Rules,
        TableMap::Tables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TableMap::Rows => "rows",
            TableMap::Pages => "pages",
            TableMap::Rules => "rules",
            TableMap::Tables => "tables",
        }
    }
}

impl std::fmt::Display for TableMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libbpf could not open the embedded object.
    #[error("opening the BPF object")]
    Open(#[source] libbpf_rs::Error),

    /// A map could not be sized as asked before load.
    #[error("sizing BPF map {map}")]
    Configure {
        map: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },

    /// The kernel refused the object: a map could not be created, or the
    /// verifier rejected a program (its log is kept).
    #[error("loading the BPF programs{}", last_line(verifier_log))]
    Load {
        #[source]
        source: libbpf_rs::Error,
        /// The verifier's log (its tail if it was long); empty when the
        /// failure was not the verifier's.
        verifier_log: String,
    },

    /// A table does not fit in what is left of one of the table maps.
    #[error(
        "the BPF {map} map is full: the table needs {needed} entries, {free} are free \
         (raise Options::max_{map})"
    )]
    MapFull {
        map: TableMap,
        needed: usize,
        free: usize,
    },

    /// A table breaks an invariant the BPF lookup relies on.
    #[error(transparent)]
    BadTable(#[from] unwind_tables::InvalidTable),

    /// `set_mappings` got more mappings than `ct_proc` holds.
    #[error("process {pid} has {count} executable mappings; at most {max} are supported")]
    TooManyMappings { pid: u32, count: usize, max: usize },

    /// `set_mappings` got an empty, overlapping or non-user mapping.
    #[error("mapping {start:#x}-{end:#x} of process {pid} is empty, overlaps another or is not in user space")]
    BadMapping { pid: u32, start: u64, end: u64 },

    /// A mapping names a table this tracer did not load.
    #[error("table {0:?} was not loaded by this tracer")]
    UnknownTable(TableId),

    /// A map operation failed.
    #[error("BPF map {map}: {op} failed")]
    Map {
        map: &'static str,
        op: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },

    /// Attaching one of the tracer's own programs failed.
    #[error("attaching to tracepoint {tracepoint}")]
    Attach {
        tracepoint: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },

    /// `bpf_prog_get_info_by_fd` failed.
    #[error("reading the statistics of BPF program {program}")]
    ProgramInfo {
        program: &'static str,
        #[source]
        source: io::Error,
    },

    /// Reading what a map holds from its fdinfo failed.
    #[error("reading the memory use of BPF map {map}")]
    MapInfo {
        map: &'static str,
        #[source]
        source: io::Error,
    },

    /// Mapping a table map into memory failed.
    #[error("mmap of BPF map {map}")]
    Mmap {
        map: &'static str,
        #[source]
        source: io::Error,
    },

    /// Making or reading the files the stacks and the counters of exited processes are
    /// kept in (in `$TMPDIR`, else `/tmp`).
    #[error("{op} the stack storage's file in the temporary directory ({dir})")]
    Spill {
        op: &'static str,
        dir: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn spill(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Spill {
            op,
            dir: std::env::temp_dir().display().to_string(),
            source,
        }
    }
}

impl Error {
    /// The verifier log of a failed load, if there is one.
    pub fn verifier_log(&self) -> Option<&str> {
        match self {
            Error::Load { verifier_log, .. } if !verifier_log.is_empty() => Some(verifier_log),
            _ => None,
        }
    }

    /// A map update found no room for a new entry (a full hash map: E2BIG), as
    /// [`Tracer::set_mappings`](crate::Tracer::set_mappings) may when the map of processes
    /// is full; [`Error::MapFull`] for the table maps.
    pub fn is_map_full(&self) -> bool {
        match self {
            Error::MapFull { .. } => true,
            Error::Map {
                op: "update",
                source,
                ..
            } => source.kind() == libbpf_rs::ErrorKind::TooBig,
            _ => false,
        }
    }

    /// The kernel said no for lack of privilege (no CAP_BPF/CAP_PERFMON, or
    /// BPF disabled): the one failure that tests treat as "cannot run here".
    /// A verifier rejection can carry EACCES too, but it comes with a log.
    pub fn is_permission_denied(&self) -> bool {
        let source = match self {
            Error::Load {
                source,
                verifier_log,
            } if verifier_log.is_empty() => source,
            Error::Open(source) | Error::Configure { source, .. } | Error::Map { source, .. } => {
                source
            }
            Error::Mmap { source, .. } => return source.kind() == io::ErrorKind::PermissionDenied,
            _ => return false,
        };
        source.kind() == libbpf_rs::ErrorKind::PermissionDenied
    }
}

/// " (verifier: <reason>)" when there is a log: the verifier states why it
/// gave up in its last line before the statistics lines.
fn last_line(log: &str) -> String {
    let reason = log.lines().rev().map(str::trim).find(|line| {
        !line.is_empty()
            && !line.starts_with("processed ")
            && !line.starts_with("verification time")
    });
    match reason {
        Some(line) => format!(" (verifier: {line})"),
        None => String::new(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_error_names_the_verifiers_reason() {
        let error = Error::Load {
            source: libbpf_rs::Error::from_raw_os_error(libc::EACCES),
            verifier_log: "0: (b7) r0 = 0\nR1 invalid mem access 'scalar'\n\
                           processed 12 insns (limit 1000000) max_states_per_insn 0\n"
                .to_string(),
        };
        let text = error.to_string();
        assert!(
            text.contains("(verifier: R1 invalid mem access 'scalar')"),
            "{text}"
        );
        assert!(error.verifier_log().unwrap().contains("processed 12 insns"));
        assert!(!error.is_permission_denied());
    }

    #[test]
    fn permission_denied_is_recognized() {
        let error = Error::Load {
            source: libbpf_rs::Error::from_raw_os_error(libc::EPERM),
            verifier_log: String::new(),
        };
        assert!(error.is_permission_denied());
        assert_eq!(error.verifier_log(), None);
        assert!(!error.to_string().contains("verifier:"));
        // The cause is the source's to say, once, not the message's too.
        assert_eq!(error.to_string(), "loading the BPF programs");
        assert!(std::error::Error::source(&error).is_some());
    }

    #[test]
    fn a_full_hash_map_is_told_from_other_map_errors() {
        let update = |errno| Error::Map {
            map: "procs",
            op: "update",
            source: libbpf_rs::Error::from_raw_os_error(errno),
        };
        assert!(update(libc::E2BIG).is_map_full());
        assert!(!update(libc::ENOMEM).is_map_full());
        let lookup = Error::Map {
            map: "procs",
            op: "lookup",
            source: libbpf_rs::Error::from_raw_os_error(libc::E2BIG),
        };
        assert!(!lookup.is_map_full());
    }

    #[test]
    fn full_map_says_which_and_what_to_raise() {
        let error = Error::MapFull {
            map: TableMap::Pages,
            needed: 30,
            free: 2,
        };
        assert_eq!(
            error.to_string(),
            "the BPF pages map is full: the table needs 30 entries, 2 are free \
             (raise Options::max_pages)"
        );
    }
}
