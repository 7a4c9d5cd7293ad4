//! Probe specs in bpftrace's grammar: `TYPE:ARG[:ARG...]`.
//!
//! Fields are separated by single colons. A doubled colon (`::`) never separates
//! fields, so Rust and C++ paths need no quoting: in `uprobe:./prog:myprog::parse` the
//! binary is `./prog` and the symbol `myprog::parse`. As in bpftrace, a field may also be
//! double-quoted (`uprobe:./prog:"ns::f"`, `uprobe:"/tmp/a:b":f`); inside quotes a colon is
//! literal and `\` escapes the next character. The first colon always ends the probe type,
//! so `uprobe::malloc` is `uprobe` with an empty binary (that of the `-p` process).

use std::fmt;
use std::str::FromStr;

use crate::suggest::closest;
use crate::wildcard::has_wildcard;

/// A parsed probe spec. `Display` writes the canonical form (long type names, hexadecimal
/// offsets, explicit periods), which parses back to an equal value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProbeSpec {
    /// `uprobe:PATH:SYMBOL[+OFFSET]`, `uprobe:PATH:0xADDR`, `uretprobe:...`.
    Uprobe(UprobeSpec),
    /// `usdt:PATH:[PROVIDER:]NAME`: a statically defined tracepoint in a binary.
    Usdt(UsdtSpec),
    /// `profile:UNIT:N`: sample every CPU at a rate (a cpu-clock perf event per CPU).
    Profile(Rate),
    /// `interval:UNIT:N`: one timer event at a rate, on one CPU.
    Interval(Rate),
    /// `tracepoint:CATEGORY:NAME` (wildcards allowed in both).
    Tracepoint { category: String, name: String },
    /// `rawtracepoint:[MODULE:]NAME`.
    RawTracepoint {
        module: Option<String>,
        name: String,
    },
    /// `kprobe:[MODULE:]FUNCTION[+OFFSET]`, `kretprobe:[MODULE:]FUNCTION`.
    Kprobe(KprobeSpec),
    /// `software:EVENT[:PERIOD]`; the period is bpftrace's default when omitted.
    Software { event: SoftwareEvent, period: u64 },
    /// `hardware:EVENT[:PERIOD]`; the period is bpftrace's default when omitted.
    Hardware { event: HardwareEvent, period: u64 },
}

/// A user-space function probe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UprobeSpec {
    /// `uretprobe` (fires when the function returns) rather than `uprobe`.
    pub retprobe: bool,
    /// The binary as written: a path (absolute or relative), a library short name
    /// (`libc`, `libc.so.6`) or a program name on `PATH`. `None` when omitted
    /// (`uprobe:SYMBOL`): the executable of the process given with `-p`.
    pub target: Option<String>,
    /// bpftrace's language field (`uprobe:PATH:cpp:SYMBOL`).
    pub lang: Option<Lang>,
    pub location: UprobeLocation,
}

/// Where in the binary a uprobe goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UprobeLocation {
    /// A function by name, plus a byte offset into it (always 0 for uretprobes).
    /// The name may be mangled, a demangled Rust path without hash, a demangled C++ name
    /// with or without its argument list, or a pattern with `*`.
    Symbol { name: String, offset: u64 },
    /// A virtual address in the binary, as `nm` or `objdump` show it.
    Address(u64),
}

/// The language named in `uprobe:PATH:LANG:SYMBOL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lang {
    /// C++: the symbol may match several overloads, and all of them are probed.
    Cpp,
}

/// A USDT (`.note.stapsdt`) probe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsdtSpec {
    /// As for [`UprobeSpec::target`].
    pub target: Option<String>,
    /// `None`: any provider.
    pub provider: Option<String>,
    pub name: String,
}

/// A kernel function probe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KprobeSpec {
    pub retprobe: bool,
    pub module: Option<String>,
    pub function: String,
    /// Byte offset into the function (always 0 for kretprobes).
    pub offset: u64,
}

/// The rate of a `profile` or `interval` probe, in the unit it was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rate {
    /// `hz:N`: N events per second.
    Hz(u64),
    /// `s:N`: one event every N seconds.
    Seconds(u64),
    /// `ms:N`
    Millis(u64),
    /// `us:N`
    Micros(u64),
}

impl Rate {
    /// The perf sampling for a clock event (whose counter counts nanoseconds).
    pub fn sampling(self) -> Sampling {
        match self {
            Rate::Hz(n) => Sampling::Frequency(n),
            Rate::Seconds(n) => Sampling::Period(n.saturating_mul(1_000_000_000)),
            Rate::Millis(n) => Sampling::Period(n.saturating_mul(1_000_000)),
            Rate::Micros(n) => Sampling::Period(n.saturating_mul(1_000)),
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Rate::Hz(_) => "hz",
            Rate::Seconds(_) => "s",
            Rate::Millis(_) => "ms",
            Rate::Micros(_) => "us",
        }
    }

    fn value(self) -> u64 {
        match self {
            Rate::Hz(n) | Rate::Seconds(n) | Rate::Millis(n) | Rate::Micros(n) => n,
        }
    }
}

/// How a perf event samples: every N counted units, or N times a second (the kernel
/// adjusts the period to hit the frequency).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sampling {
    Period(u64),
    Frequency(u64),
}

macro_rules! perf_events {
    ($(#[$meta:meta])* $name:ident, $what:literal,
     [$($variant:ident = $canonical:literal $(| $alias:literal)*, $config:ident, $default:literal;)*]) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant,)*
        }

        impl $name {
            /// Every event, in bpftrace's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The canonical name (`perf list`'s and bpftrace's).
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $canonical,)*
                }
            }

            /// Other names bpftrace accepts.
            pub fn aliases(self) -> &'static [&'static str] {
                match self {
                    $($name::$variant => &[$($alias),*],)*
                }
            }

            /// The `perf_event_attr.config` value.
            pub fn config(self) -> u64 {
                match self {
                    $($name::$variant => perf_event_open_sys::bindings::$config as u64,)*
                }
            }

            /// bpftrace's period when the spec gives none.
            pub fn default_period(self) -> u64 {
                match self {
                    $($name::$variant => $default,)*
                }
            }

            /// Looks an event up by canonical name or alias.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|e| e.name() == name || e.aliases().contains(&name))
            }

            fn expected() -> String {
                let names: Vec<String> = Self::ALL
                    .iter()
                    .map(|e| match e.aliases() {
                        [] => e.name().to_string(),
                        aliases => format!("{} ({})", e.name(), aliases.join(", ")),
                    })
                    .collect();
                format!(concat!("a ", $what, " event: {}"), names.join(", "))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

perf_events!(
    /// A `software:` event (`PERF_TYPE_SOFTWARE`), with bpftrace's names, aliases and
    /// default periods.
    SoftwareEvent, "software", [
    AlignmentFaults = "alignment-faults", PERF_COUNT_SW_ALIGNMENT_FAULTS, 1;
    BpfOutput = "bpf-output", PERF_COUNT_SW_BPF_OUTPUT, 1;
    ContextSwitches = "context-switches" | "cs", PERF_COUNT_SW_CONTEXT_SWITCHES, 1000;
    CpuClock = "cpu-clock" | "cpu", PERF_COUNT_SW_CPU_CLOCK, 1_000_000;
    CpuMigrations = "cpu-migrations", PERF_COUNT_SW_CPU_MIGRATIONS, 1;
    Dummy = "dummy", PERF_COUNT_SW_DUMMY, 1;
    EmulationFaults = "emulation-faults", PERF_COUNT_SW_EMULATION_FAULTS, 1;
    MajorFaults = "major-faults", PERF_COUNT_SW_PAGE_FAULTS_MAJ, 1;
    MinorFaults = "minor-faults", PERF_COUNT_SW_PAGE_FAULTS_MIN, 100;
    PageFaults = "page-faults" | "faults", PERF_COUNT_SW_PAGE_FAULTS, 100;
    TaskClock = "task-clock", PERF_COUNT_SW_TASK_CLOCK, 1;
]);

perf_events!(
    /// A `hardware:` event (`PERF_TYPE_HARDWARE`), with bpftrace's names, aliases and
    /// default periods.
    HardwareEvent, "hardware", [
    BackendStalls = "backend-stalls", PERF_COUNT_HW_STALLED_CYCLES_BACKEND, 1_000_000;
    BranchInstructions = "branch-instructions" | "branches", PERF_COUNT_HW_BRANCH_INSTRUCTIONS, 100_000;
    BranchMisses = "branch-misses", PERF_COUNT_HW_BRANCH_MISSES, 100_000;
    BusCycles = "bus-cycles", PERF_COUNT_HW_BUS_CYCLES, 100_000;
    CacheMisses = "cache-misses", PERF_COUNT_HW_CACHE_MISSES, 1_000_000;
    CacheReferences = "cache-references", PERF_COUNT_HW_CACHE_REFERENCES, 1_000_000;
    CpuCycles = "cpu-cycles" | "cycles", PERF_COUNT_HW_CPU_CYCLES, 1_000_000;
    FrontendStalls = "frontend-stalls", PERF_COUNT_HW_STALLED_CYCLES_FRONTEND, 1_000_000;
    Instructions = "instructions", PERF_COUNT_HW_INSTRUCTIONS, 1_000_000;
    RefCycles = "ref-cycles", PERF_COUNT_HW_REF_CPU_CYCLES, 1_000_000;
]);

/// Which kind of BPF program a probe needs; the caller loads one of that kind and hands
/// it to [`crate::attach_probe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramKind {
    /// `SEC("uprobe")` (also for USDT probes).
    Uprobe,
    /// `SEC("uretprobe")`
    Uretprobe,
    /// `SEC("perf_event")`: profile, interval, software, hardware.
    PerfEvent,
    /// `SEC("tracepoint")`
    Tracepoint,
    /// `SEC("raw_tp")`
    RawTracepoint,
    /// `SEC("kprobe")`
    Kprobe,
    /// `SEC("kretprobe")`
    Kretprobe,
}

impl ProbeSpec {
    /// The kind of BPF program this probe runs.
    pub fn program_kind(&self) -> ProgramKind {
        match self {
            ProbeSpec::Uprobe(u) if u.retprobe => ProgramKind::Uretprobe,
            ProbeSpec::Uprobe(_) | ProbeSpec::Usdt(_) => ProgramKind::Uprobe,
            ProbeSpec::Profile(_)
            | ProbeSpec::Interval(_)
            | ProbeSpec::Software { .. }
            | ProbeSpec::Hardware { .. } => ProgramKind::PerfEvent,
            ProbeSpec::Tracepoint { .. } => ProgramKind::Tracepoint,
            ProbeSpec::RawTracepoint { .. } => ProgramKind::RawTracepoint,
            ProbeSpec::Kprobe(k) if k.retprobe => ProgramKind::Kretprobe,
            ProbeSpec::Kprobe(_) => ProgramKind::Kprobe,
        }
    }

    /// Whether the probe fires in user code of a particular binary.
    pub fn is_user(&self) -> bool {
        matches!(self, ProbeSpec::Uprobe(_) | ProbeSpec::Usdt(_))
    }
}

/// Why a probe spec does not parse. Every message is one line naming the spec and the
/// form that was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty probe spec (expected e.g. profile:hz:99 or uprobe:PATH:SYMBOL)")]
    Empty,
    #[error("unknown probe type '{ty}' in '{spec}' (expected {}){}", PROBE_TYPES.join(", "),
            suggestion.map(|s| format!("; did you mean '{s}'?")).unwrap_or_default())]
    UnknownType {
        ty: String,
        spec: String,
        suggestion: Option<&'static str>,
    },
    #[error("{ty} probes are not supported in '{spec}'; {hint}")]
    UnsupportedType {
        ty: String,
        spec: String,
        hint: &'static str,
    },
    #[error("unterminated quote in '{spec}'")]
    UnterminatedQuote { spec: String },
    #[error("wildcards are not supported in the {field} of '{spec}'; {hint}")]
    Wildcard {
        field: &'static str,
        spec: String,
        hint: &'static str,
    },
    #[error(
        "filters are not supported ('{filter}' in '{spec}'): cargo-trace traces only the \
         process given with -c or -p and its children (--no-follow-forks for that process \
         alone); drop the filter"
    )]
    Filter { filter: String, spec: String },
    #[error(
        "actions are not supported ('{action}' in '{spec}'): cargo-trace counts each probe's \
         events by stack; drop the action"
    )]
    Action { action: String, spec: String },
    #[error("'{spec}' is a list of {count} probes: split it with split_list")]
    List { spec: String, count: usize },
    /// Anything else: a wrong field count, an empty field, a bad number, an unknown
    /// unit or event.
    #[error("{problem} in '{spec}' (expected {expected})")]
    Invalid {
        problem: String,
        spec: String,
        expected: String,
    },
}

/// The probe types this crate attaches, long names first; see [`parse`].
const PROBE_TYPES: &[&str] = &[
    "uprobe",
    "uretprobe",
    "usdt",
    "profile",
    "interval",
    "tracepoint",
    "rawtracepoint",
    "software",
    "hardware",
    "kprobe",
    "kretprobe",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    Uprobe,
    Uretprobe,
    Usdt,
    Profile,
    Interval,
    Tracepoint,
    RawTracepoint,
    Software,
    Hardware,
    Kprobe,
    Kretprobe,
}

fn probe_type(name: &str) -> Option<Type> {
    // Case matters: bpftrace's `U` is usdt, `u` uprobe.
    Some(match name {
        "uprobe" | "u" => Type::Uprobe,
        "uretprobe" | "ur" => Type::Uretprobe,
        "usdt" | "U" => Type::Usdt,
        "profile" | "p" => Type::Profile,
        "interval" | "i" => Type::Interval,
        "tracepoint" | "t" => Type::Tracepoint,
        "rawtracepoint" | "rt" => Type::RawTracepoint,
        "software" | "s" => Type::Software,
        "hardware" | "h" => Type::Hardware,
        "kprobe" | "k" => Type::Kprobe,
        "kretprobe" | "kr" => Type::Kretprobe,
        _ => return None,
    })
}

/// bpftrace probe types this crate knows but does not attach, and what to use instead.
fn unsupported_type(name: &str) -> Option<&'static str> {
    Some(match name {
        "fentry" | "f" | "kfunc" | "fexit" | "fr" | "kretfunc" => {
            "BPF trampolines are not used; try kprobe:FUNCTION where the kernel has kprobes, or a tracepoint"
        }
        "BEGIN" | "END" | "self" => "it is a bpftrace script block, not an event to profile",
        "watchpoint" | "w" | "asyncwatchpoint" | "aw" => {
            "hardware watchpoints are not supported; try a uprobe on the code that writes"
        }
        "iter" | "it" => "BPF iterators have no user stacks to profile",
        "lsm" => "LSM hooks are not supported; try a tracepoint",
        _ => return None,
    })
}

fn expected_form(ty: Type) -> &'static str {
    match ty {
        Type::Uprobe => {
            "uprobe:PATH:SYMBOL, uprobe:PATH:SYMBOL+OFFSET or uprobe:PATH:0xADDRESS; \
             PATH may be a library short name like libc"
        }
        Type::Uretprobe => "uretprobe:PATH:SYMBOL or uretprobe:PATH:0xADDRESS",
        Type::Usdt => "usdt:PATH:PROVIDER:NAME or usdt:PATH:NAME",
        Type::Profile => "profile:hz:N, profile:s:N, profile:ms:N or profile:us:N",
        Type::Interval => "interval:s:N, interval:ms:N, interval:us:N or interval:hz:N",
        Type::Tracepoint => "tracepoint:CATEGORY:NAME, e.g. tracepoint:sched:sched_switch",
        Type::RawTracepoint => "rawtracepoint:NAME or rawtracepoint:MODULE:NAME",
        Type::Kprobe => "kprobe:FUNCTION, kprobe:FUNCTION+OFFSET or kprobe:MODULE:FUNCTION",
        Type::Kretprobe => "kretprobe:FUNCTION or kretprobe:MODULE:FUNCTION",
        Type::Software => "software:EVENT or software:EVENT:PERIOD",
        Type::Hardware => "hardware:EVENT or hardware:EVENT:PERIOD",
    }
}

/// Splits the arguments (everything after the probe type's colon) at single colons
/// outside quotes. Runs of two or more colons are kept as text; quotes are removed.
fn split_fields(args: &str, spec: &str) -> Result<Vec<String>, ParseError> {
    let chars: Vec<char> = args.chars().collect();
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_quotes {
            match c {
                '\\' if i + 1 < chars.len() => {
                    current.push(chars[i + 1]);
                    i += 2;
                    continue;
                }
                '"' => in_quotes = false,
                _ => current.push(c),
            }
            i += 1;
            continue;
        }
        match c {
            '"' => in_quotes = true,
            ':' => {
                let run = chars[i..].iter().take_while(|&&c| c == ':').count();
                if run == 1 {
                    fields.push(std::mem::take(&mut current));
                } else {
                    current.extend(std::iter::repeat_n(':', run));
                    i += run;
                    continue;
                }
            }
            _ => current.push(c),
        }
        i += 1;
    }
    if in_quotes {
        return Err(ParseError::UnterminatedQuote {
            spec: spec.to_string(),
        });
    }
    fields.push(current);
    Ok(fields)
}

/// Parses an unsigned integer, decimal or `0x` hexadecimal.
fn parse_uint(text: &str) -> Option<u64> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse().ok()
    } else {
        None
    }
}

struct Parser<'a> {
    spec: &'a str,
    ty: Type,
}

impl Parser<'_> {
    fn invalid(&self, problem: impl Into<String>) -> ParseError {
        ParseError::Invalid {
            problem: problem.into(),
            spec: self.spec.to_string(),
            expected: expected_form(self.ty).to_string(),
        }
    }

    fn invalid_expecting(&self, problem: impl Into<String>, expected: String) -> ParseError {
        ParseError::Invalid {
            problem: problem.into(),
            spec: self.spec.to_string(),
            expected,
        }
    }

    fn wildcard(&self, field: &'static str, hint: &'static str) -> ParseError {
        ParseError::Wildcard {
            field,
            spec: self.spec.to_string(),
            hint,
        }
    }

    fn field_count(&self, fields: &[String], allowed: &[usize]) -> Result<(), ParseError> {
        if allowed.contains(&fields.len()) {
            return Ok(());
        }
        let found = fields.len();
        Err(self.invalid(format!(
            "{found} field{} after the probe type",
            if found == 1 { "" } else { "s" }
        )))
    }

    fn non_empty<'f>(&self, field: &'f str, what: &str) -> Result<&'f str, ParseError> {
        if field.is_empty() {
            Err(self.invalid(format!("empty {what}")))
        } else {
            Ok(field)
        }
    }

    fn parse(&self, fields: Vec<String>) -> Result<ProbeSpec, ParseError> {
        match self.ty {
            Type::Uprobe => self.uprobe(fields, false),
            Type::Uretprobe => self.uprobe(fields, true),
            Type::Usdt => self.usdt(fields),
            Type::Profile => Ok(ProbeSpec::Profile(self.rate(&fields)?)),
            Type::Interval => Ok(ProbeSpec::Interval(self.rate(&fields)?)),
            Type::Tracepoint => {
                self.field_count(&fields, &[2])?;
                let category = self.non_empty(&fields[0], "tracepoint category")?;
                let name = self.non_empty(&fields[1], "tracepoint name")?;
                Ok(ProbeSpec::Tracepoint {
                    category: category.to_string(),
                    name: name.to_string(),
                })
            }
            Type::RawTracepoint => {
                self.field_count(&fields, &[1, 2])?;
                let (module, name) = match fields.as_slice() {
                    [name] => (None, name),
                    [module, name] => (Some(self.non_empty(module, "module")?), name),
                    _ => unreachable!("field count checked"),
                };
                let name = self.non_empty(name, "raw tracepoint name")?;
                if has_wildcard(name) || module.is_some_and(has_wildcard) {
                    return Err(self.wildcard("raw tracepoint", "give one tracepoint"));
                }
                Ok(ProbeSpec::RawTracepoint {
                    module: module.map(str::to_string),
                    name: name.to_string(),
                })
            }
            Type::Kprobe => self.kprobe(fields, false),
            Type::Kretprobe => self.kprobe(fields, true),
            Type::Software => {
                let (event, period) = self.perf_event(&fields, SoftwareEvent::from_name, || {
                    ("software", SoftwareEvent::expected())
                })?;
                Ok(ProbeSpec::Software {
                    period: period.unwrap_or_else(|| event.default_period()),
                    event,
                })
            }
            Type::Hardware => {
                let (event, period) = self.perf_event(&fields, HardwareEvent::from_name, || {
                    ("hardware", HardwareEvent::expected())
                })?;
                Ok(ProbeSpec::Hardware {
                    period: period.unwrap_or_else(|| event.default_period()),
                    event,
                })
            }
        }
    }

    fn uprobe(&self, fields: Vec<String>, retprobe: bool) -> Result<ProbeSpec, ParseError> {
        self.field_count(&fields, &[1, 2, 3])?;
        let (target, lang, location) = match fields.as_slice() {
            [location] => (None, None, location),
            [target, location] => (Some(target), None, location),
            [target, lang, location] => {
                let lang = match lang.as_str() {
                    "cpp" => Lang::Cpp,
                    other => {
                        return Err(self.invalid(format!(
                            "unknown language '{other}' (only cpp is known; \
                             a path is written with '::', as in {other}::{location})"
                        )))
                    }
                };
                (Some(target), Some(lang), location)
            }
            _ => unreachable!("field count checked"),
        };
        let target = target.filter(|t| !t.is_empty()).cloned();
        if target.is_none() && location.contains('/') {
            // `uprobe:/bin/bash`: a path without a symbol, not a symbol of the -p process.
            return Err(self.invalid("missing symbol"));
        }
        if target.as_deref().is_some_and(has_wildcard) {
            return Err(self.wildcard("binary path", "give one file"));
        }
        let location = self.non_empty(location, "symbol")?;
        let location = if let Some(address) = parse_uint(location) {
            UprobeLocation::Address(address)
        } else {
            let (name, offset) = self.symbol_offset(location)?;
            if retprobe && offset != 0 {
                return Err(self.invalid("an offset in a uretprobe"));
            }
            if offset != 0 && has_wildcard(name) {
                return Err(self.wildcard("symbol", "an offset needs one function"));
            }
            UprobeLocation::Symbol {
                name: name.to_string(),
                offset,
            }
        };
        Ok(ProbeSpec::Uprobe(UprobeSpec {
            retprobe,
            target,
            lang,
            location,
        }))
    }

    /// Splits `NAME+OFFSET`. A `+` not followed by a digit belongs to the name, so
    /// C++'s `operator+` needs no quoting.
    fn symbol_offset<'f>(&self, text: &'f str) -> Result<(&'f str, u64), ParseError> {
        match text.rsplit_once('+') {
            Some((name, offset)) if offset.starts_with(|c: char| c.is_ascii_digit()) => {
                let offset = parse_uint(offset)
                    .ok_or_else(|| self.invalid(format!("invalid offset '{offset}'")))?;
                let name = self.non_empty(name, "symbol")?;
                Ok((name, offset))
            }
            _ => Ok((text, 0)),
        }
    }

    fn usdt(&self, fields: Vec<String>) -> Result<ProbeSpec, ParseError> {
        self.field_count(&fields, &[1, 2, 3])?;
        let (target, provider, name) = match fields.as_slice() {
            [name] => (None, None, name),
            [target, name] => (Some(target), None, name),
            [target, provider, name] => (Some(target), Some(provider), name),
            _ => unreachable!("field count checked"),
        };
        let target = target.filter(|t| !t.is_empty()).cloned();
        if target.is_none() && name.contains('/') {
            return Err(self.invalid("missing probe name"));
        }
        if target.as_deref().is_some_and(has_wildcard) {
            return Err(self.wildcard("binary path", "give one file"));
        }
        let provider = match provider {
            Some(p) => Some(self.non_empty(p, "provider")?.to_string()),
            None => None,
        };
        let name = self.non_empty(name, "probe name")?;
        Ok(ProbeSpec::Usdt(UsdtSpec {
            target,
            provider,
            name: name.to_string(),
        }))
    }

    fn rate(&self, fields: &[String]) -> Result<Rate, ParseError> {
        self.field_count(fields, &[2])?;
        let value = parse_uint(&fields[1])
            .ok_or_else(|| self.invalid(format!("invalid rate '{}'", fields[1])))?;
        if value == 0 {
            return Err(self.invalid("a rate of 0"));
        }
        Ok(match fields[0].as_str() {
            "hz" => Rate::Hz(value),
            "s" => Rate::Seconds(value),
            "ms" => Rate::Millis(value),
            "us" => Rate::Micros(value),
            unit => return Err(self.invalid(format!("unknown unit '{unit}'"))),
        })
    }

    fn kprobe(&self, fields: Vec<String>, retprobe: bool) -> Result<ProbeSpec, ParseError> {
        self.field_count(&fields, &[1, 2])?;
        let (module, function) = match fields.as_slice() {
            [function] => (None, function),
            [module, function] => (Some(self.non_empty(module, "module")?), function),
            _ => unreachable!("field count checked"),
        };
        let function = self.non_empty(function, "function")?;
        let (function, offset) = self.symbol_offset(function)?;
        if retprobe && offset != 0 {
            return Err(self.invalid("an offset in a kretprobe"));
        }
        if has_wildcard(function) || module.is_some_and(has_wildcard) {
            return Err(self.wildcard("kernel function", "give one function"));
        }
        Ok(ProbeSpec::Kprobe(KprobeSpec {
            retprobe,
            module: module.map(str::to_string),
            function: function.to_string(),
            offset,
        }))
    }

    fn perf_event<E>(
        &self,
        fields: &[String],
        from_name: impl Fn(&str) -> Option<E>,
        describe: impl Fn() -> (&'static str, String),
    ) -> Result<(E, Option<u64>), ParseError> {
        self.field_count(fields, &[1, 2])?;
        let name = self.non_empty(&fields[0], "event")?;
        if has_wildcard(name) {
            return Err(self.wildcard("event", "give one event"));
        }
        let Some(event) = from_name(name) else {
            let (kind, expected) = describe();
            return Err(self.invalid_expecting(format!("unknown {kind} event '{name}'"), expected));
        };
        let period = match fields.get(1) {
            None => None,
            Some(text) => match parse_uint(text) {
                Some(0) => return Err(self.invalid("a period of 0")),
                Some(period) => Some(period),
                None => return Err(self.invalid(format!("invalid period '{text}'"))),
            },
        };
        Ok((event, period))
    }
}

/// Parses a probe spec in bpftrace's grammar.
///
/// Accepted forms (short type names in parentheses):
/// - `uprobe:PATH:SYMBOL`, `uprobe:PATH:SYMBOL+OFFSET`, `uprobe:PATH:0xADDR`,
///   `uprobe:PATH:cpp:SYMBOL` (`u`); `uretprobe:` the same without offsets (`ur`).
///   PATH may be a library short name (`libc`); it may be omitted (`uprobe:SYMBOL`) to mean
///   the `-p` process's executable; SYMBOL may contain `::` and `*`.
/// - `usdt:PATH:PROVIDER:NAME`, `usdt:PATH:NAME` (`U`)
/// - `profile:hz:N`, `profile:s:N`, `profile:ms:N`, `profile:us:N` (`p`); `interval:` the
///   same (`i`)
/// - `tracepoint:CATEGORY:NAME` (`t`), wildcards allowed
/// - `rawtracepoint:NAME`, `rawtracepoint:MODULE:NAME` (`rt`)
/// - `kprobe:FUNCTION`, `kprobe:FUNCTION+OFFSET`, `kprobe:MODULE:FUNCTION` (`k`);
///   `kretprobe:` without offsets (`kr`)
/// - `software:EVENT[:PERIOD]` (`s`), `hardware:EVENT[:PERIOD]` (`h`)
pub fn parse(spec: &str) -> Result<ProbeSpec, ParseError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(ParseError::Empty);
    }
    let list = split_list(spec)?;
    if list.len() > 1 {
        return Err(ParseError::List {
            spec: spec.to_string(),
            count: list.len(),
        });
    }
    let (ty_name, args) = match spec.split_once(':') {
        Some((ty, args)) => (ty, Some(args)),
        None => (spec, None),
    };
    let Some(ty) = probe_type(ty_name) else {
        if let Some(hint) = unsupported_type(ty_name) {
            return Err(ParseError::UnsupportedType {
                ty: ty_name.to_string(),
                spec: spec.to_string(),
                hint,
            });
        }
        if has_wildcard(ty_name) {
            return Err(ParseError::Wildcard {
                field: "probe type",
                spec: spec.to_string(),
                hint: "give one probe type",
            });
        }
        return Err(ParseError::UnknownType {
            ty: ty_name.to_string(),
            spec: spec.to_string(),
            suggestion: closest(ty_name, PROBE_TYPES.iter().copied()),
        });
    };
    let parser = Parser { spec, ty };
    let Some(args) = args else {
        return Err(parser.invalid("no arguments"));
    };
    let fields = split_fields(args, spec)?;
    parser.parse(fields)
}

/// Splits one argument into the probe specs it lists, as bpftrace's comma lists
/// (`uprobe:./p:f,uprobe:./p:g`), each trimmed, for [`parse`].
///
/// A comma separates probes only outside quotes and brackets and when a probe type and
/// its colon follow it, so C++ argument lists (`ns::f(int, char)`) stay whole. A
/// bpftrace filter (`uprobe:./p:f /pid == 1/`) or action block (`{ ... }`) is an
/// error saying what to do instead.
pub fn split_list(text: &str) -> Result<Vec<&str>, ParseError> {
    let spec = text.trim();
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut depth = 0usize;
    let mut previous_is_space = false;
    let mut chars = spec.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if in_quotes {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_quotes = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_quotes = true,
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth = depth.saturating_sub(1),
            '/' | '{' if previous_is_space => {
                let rest = spec[i..].to_string();
                return Err(if c == '/' {
                    ParseError::Filter {
                        filter: rest,
                        spec: spec.to_string(),
                    }
                } else {
                    ParseError::Action {
                        action: rest,
                        spec: spec.to_string(),
                    }
                });
            }
            ',' if depth == 0 && starts_with_probe_type(&spec[i + 1..]) => {
                pieces.push(spec[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        previous_is_space = c.is_whitespace();
    }
    pieces.push(spec[start..].trim());
    Ok(pieces)
}

/// Whether `text` starts with a probe type (known or not attached) and its colon.
fn starts_with_probe_type(text: &str) -> bool {
    text.trim_start()
        .split_once(':')
        .is_some_and(|(ty, _)| probe_type(ty).is_some() || unsupported_type(ty).is_some())
}

impl FromStr for ProbeSpec {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

/// Writes a field so that [`split_fields`] reads it back unchanged: quoted when it holds
/// a colon that would split it or a quote.
struct Field<'a>(&'a str);

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        if needs_quotes(text) {
            f.write_str("\"")?;
            for c in text.chars() {
                if c == '"' || c == '\\' {
                    f.write_str("\\")?;
                }
                write!(f, "{c}")?;
            }
            f.write_str("\"")
        } else {
            f.write_str(text)
        }
    }
}

fn needs_quotes(text: &str) -> bool {
    if text.contains('"') || text.starts_with(':') || text.ends_with(':') {
        return true;
    }
    // Only inner runs of two or more colons survive splitting unquoted.
    text.split(|c| c != ':').any(|run| run.len() == 1)
}

impl fmt::Display for UprobeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.retprobe {
            "uretprobe:"
        } else {
            "uprobe:"
        })?;
        if let Some(target) = &self.target {
            write!(f, "{}:", Field(target))?;
        }
        if let Some(Lang::Cpp) = self.lang {
            if self.target.is_none() {
                // `uprobe:cpp:f` would read as binary `cpp`; keep the empty binary field.
                f.write_str(":")?;
            }
            f.write_str("cpp:")?;
        }
        match &self.location {
            UprobeLocation::Address(address) => write!(f, "{address:#x}"),
            UprobeLocation::Symbol { name, offset } => {
                write!(f, "{}", Field(name))?;
                if *offset != 0 {
                    write!(f, "+{offset:#x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for UsdtSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("usdt:")?;
        match (&self.target, &self.provider) {
            (Some(target), Some(provider)) => write!(f, "{}:{}:", Field(target), Field(provider))?,
            (Some(target), None) => write!(f, "{}:", Field(target))?,
            // bpftrace's grammar has no spelling for a provider without a binary.
            (None, Some(provider)) => write!(f, ":{}:", Field(provider))?,
            (None, None) => {}
        }
        write!(f, "{}", Field(&self.name))
    }
}

impl fmt::Display for KprobeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.retprobe {
            "kretprobe:"
        } else {
            "kprobe:"
        })?;
        if let Some(module) = &self.module {
            write!(f, "{}:", Field(module))?;
        }
        write!(f, "{}", Field(&self.function))?;
        if self.offset != 0 {
            write!(f, "+{:#x}", self.offset)?;
        }
        Ok(())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.unit(), self.value())
    }
}

impl fmt::Display for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeSpec::Uprobe(u) => write!(f, "{u}"),
            ProbeSpec::Usdt(u) => write!(f, "{u}"),
            ProbeSpec::Profile(rate) => write!(f, "profile:{rate}"),
            ProbeSpec::Interval(rate) => write!(f, "interval:{rate}"),
            ProbeSpec::Tracepoint { category, name } => {
                write!(f, "tracepoint:{}:{}", Field(category), Field(name))
            }
            ProbeSpec::RawTracepoint { module, name } => {
                f.write_str("rawtracepoint:")?;
                if let Some(module) = module {
                    write!(f, "{}:", Field(module))?;
                }
                write!(f, "{}", Field(name))
            }
            ProbeSpec::Kprobe(k) => write!(f, "{k}"),
            ProbeSpec::Software { event, period } => write!(f, "software:{event}:{period}"),
            ProbeSpec::Hardware { event, period } => write!(f, "hardware:{event}:{period}"),
        }
    }
}

#[cfg(test)]
mod tests;
