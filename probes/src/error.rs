//! The crate's errors: why a spec does not resolve ([`ResolveError`]), why attaching
//! failed ([`AttachError`]), and any of them ([`Error`]). A leaf: every module that
//! fails says so through these, and none of them imports the modules that fail.

use std::io;
use std::path::PathBuf;

use crate::instructions::HazardKind;
use crate::spec::HardwareEvent;

/// Why a uprobe or USDT spec does not resolve. One line each, naming the file and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("'{spec}' names no binary; write it as {form}, or attach to a process with -p PID")]
    MissingTarget { spec: String, form: &'static str },
    #[error("no such file: {}", path.display())]
    FileNotFound { path: PathBuf },
    #[error("library '{name}' not found in {searched}; give its path")]
    LibraryNotFound { name: String, searched: String },
    #[error(
        "'{name}' is neither a file in the current directory nor a program on PATH; give its path"
    )]
    ProgramNotFound { name: String },
    #[error("{}", match source.kind() {
        io::ErrorKind::NotFound => format!("no process {pid}"),
        _ => format!("process {pid} cannot be inspected through /proc/{pid}"),
    })]
    NoProcess {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not an ELF file", path.display())]
    NotElf { path: PathBuf },
    #[error("cannot probe {}: {reason}", path.display())]
    UnsupportedElf { path: PathBuf, reason: String },
    #[error("no function '{symbol}' in {}{}", path.display(), did_you_mean(suggestions))]
    SymbolNotFound {
        symbol: String,
        path: PathBuf,
        suggestions: Vec<String>,
    },
    #[error(
        "no function '{symbol}' in {}: the binary is stripped (no .symtab) and '{symbol}' \
         is not among its {exported} exported functions (.dynsym){}",
        path.display(), did_you_mean(suggestions)
    )]
    Stripped {
        symbol: String,
        path: PathBuf,
        exported: usize,
        suggestions: Vec<String>,
    },
    #[error(
        "'{symbol}' matches {count} functions at different addresses in {}: {}{}; \
         give one's mangled name, or '{symbol}*' to probe them all",
        path.display(), candidates.join(", "),
        if *count > candidates.len() { ", ..." } else { "" }
    )]
    AmbiguousSymbol {
        symbol: String,
        path: PathBuf,
        candidates: Vec<String>,
        count: usize,
    },
    #[error(
        "no function '{symbol}' in {library}, but libc has it (glibc 2.34 merged libpthread, \
         libdl and librt into libc); use {suggested}"
    )]
    InLibc {
        symbol: String,
        library: String,
        suggested: String,
    },
    #[error("offset {offset:#x} is past the end of {symbol} ({size} bytes) in {}", path.display())]
    OffsetOutOfRange {
        symbol: String,
        offset: u64,
        size: u64,
        path: PathBuf,
    },
    #[error("address {address:#x} is not in an executable segment of {}", path.display())]
    AddressNotInCode { address: u64, path: PathBuf },
    #[error(
        "{location} is inside an instruction of {function} in {}: a uprobe there would \
         crash every process running the file; the nearest instruction boundaries are \
         {before} and {after}",
        path.display()
    )]
    InsideInstruction {
        location: String,
        function: String,
        path: PathBuf,
        before: String,
        after: String,
    },
    #[error(
        "cannot check that {location} starts an instruction: {function} in {} does not \
         decode at {at:#x}; probe the function's start, or pass --unsafe to probe it anyway",
        path.display()
    )]
    Undecodable {
        location: String,
        function: String,
        path: PathBuf,
        at: u64,
    },
    #[error(
        "{location} in {} is {instruction}, {}; probe the next instruction, at {next}",
        path.display(), kind.why()
    )]
    Hazard {
        location: String,
        kind: HazardKind,
        instruction: String,
        path: PathBuf,
        next: String,
    },
    #[error(
        "{function} in {} starts with {instruction}, {}; its next instruction {reason}: \
         probe one further in with FUNCTION+OFFSET",
        path.display(), kind.why()
    )]
    HazardEntry {
        function: String,
        kind: HazardKind,
        instruction: String,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "address {address:#x} is in no known function of {}, so it cannot be checked to \
         start an instruction (a uprobe inside one crashes every process running the file); \
         probe FUNCTION+OFFSET instead, or pass --unsafe to probe it anyway",
        path.display()
    )]
    OutsideFunctions { address: u64, path: PathBuf },
    #[error("no USDT probe '{probe}' in {}{}", path.display(), usdt_listing(available, *total))]
    UsdtNotFound {
        probe: String,
        path: PathBuf,
        available: Vec<String>,
        total: usize,
    },
}

fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", suggestions.join(", "))
    }
}

fn usdt_listing(available: &[String], total: usize) -> String {
    match total {
        0 => " (it has no USDT probes)".to_string(),
        _ => format!(
            " (it has {total}: {}{})",
            available.join(", "),
            if total > available.len() { ", ..." } else { "" }
        ),
    }
}

/// Why attaching failed. One line each, saying what to do where something can be done.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "kprobes are not available on this kernel (CONFIG_KPROBES is not set); try a tracepoint"
    )]
    KprobesUnavailable,
    #[error(
        "kprobe events are not available on this kernel (CONFIG_KPROBE_EVENTS is not set); \
         try a tracepoint"
    )]
    KprobeEventsUnavailable,
    #[error(
        "hardware perf events are not available on this machine (no PMU, e.g. in a VM); \
         try software:cpu-clock or profile:hz"
    )]
    HardwareUnavailable { event: HardwareEvent },
    #[error(
        "no tracepoint {category}:{name}{}; see {}/available_events",
        suggestion.as_ref().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default(),
        root.display()
    )]
    NoTracepoint {
        category: String,
        name: String,
        root: PathBuf,
        suggestion: Option<String>,
    },
    #[error(
        "no raw tracepoint {name}; raw tracepoints are named as tracepoints without their \
         category (e.g. sched_switch)"
    )]
    NoRawTracepoint { name: String },
    #[error("tracefs is not available: {reason}; mount it with: mount -t tracefs nodev /sys/kernel/tracing")]
    Tracefs { reason: String },
    #[error("cannot open a {event} perf event on CPU {cpu}{hint}")]
    PerfEventOpen {
        event: String,
        cpu: i32,
        #[source]
        source: io::Error,
        hint: String,
    },
    #[error("cannot read the online CPUs from /sys/devices/system/cpu/online: {reason}")]
    OnlineCpus { reason: String },
    #[error(
        "the kernel refuses {probe}: its uprobes cannot run the instruction there (ENOTSUPP; \
         many AVX instructions are refused); probe another instruction"
    )]
    InstructionRefused { probe: String },
    #[error("attaching {probe} failed{}", libbpf_hint(source))]
    Libbpf {
        probe: String,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("program '{program}' is of type {found}, but {probe} needs {expected}")]
    WrongProgramType {
        program: String,
        found: String,
        probe: String,
        expected: &'static str,
    },
    #[error("{what} are not supported yet")]
    Unsupported { what: String },
    #[error("cannot define the uprobe event '{command}' in tracefs: {source}")]
    UprobeEvent {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot attach {probe}: the processes it is for ({}) are gone",
        list_pids(processes)
    )]
    ProcessesGone { probe: String, processes: Vec<u32> },
}

fn list_pids(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn libbpf_hint(error: &libbpf_rs::Error) -> &'static str {
    match error.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => "; this needs root, or CAP_BPF and CAP_PERFMON",
        _ => "",
    }
}

/// Any error of the crate, for callers that go from a spec string to links.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Parse(#[from] crate::spec::ParseError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Attach(#[from] AttachError),
}
