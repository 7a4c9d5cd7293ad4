//! The session's probes: each as the user wrote it and as parsed, what it weighs, and
//! the BPF program it attaches. The one place of the binary a new probe kind touches
//! (the grammar and attaching are the `probes` crate's, the program `bpf-prog`'s).

use anyhow::Result;
use bpf_prog::EventProgram;
use probes::{ProbeSpec, ProgramKind, Rate};

use crate::alloc::AllocProbe;

/// A probe as the user wrote it and as parsed.
#[derive(Clone, Debug)]
pub struct Probe {
    pub text: String,
    pub kind: ProbeKind,
}

#[derive(Clone, Debug)]
pub enum ProbeKind {
    /// A probe of bpftrace's grammar: one event program.
    Event(ProbeSpec),
    /// Heap profiling: an allocator's functions.
    Heap(AllocProbe),
}

impl Probe {
    /// The spec of an event probe; `None` for a heap probe.
    pub fn event_spec(&self) -> Option<&ProbeSpec> {
        match &self.kind {
            ProbeKind::Event(spec) => Some(spec),
            ProbeKind::Heap(_) => None,
        }
    }

    /// Whether it profiles the heap.
    pub fn is_heap(&self) -> bool {
        matches!(self.kind, ProbeKind::Heap(_))
    }

    /// How one of its events weighs; `None` for a heap probe (its values are its own).
    pub fn weight(&self) -> Option<Weight> {
        let spec = self.event_spec()?;
        Some(match (spec, clock_period_ns(spec)) {
            (_, Some(period)) => Weight::Clock(period),
            (ProbeSpec::OffCpu, _) => Weight::OffCpu,
            _ => Weight::Events(event_program(spec.program_kind()).count_name()),
        })
    }

    /// Whether it is an `interval` probe, whose firings elsewhere count without stacks.
    pub fn is_interval(&self) -> bool {
        matches!(self.event_spec(), Some(ProbeSpec::Interval(_)))
    }
}

/// How one event of a probe weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// A clock sample, standing for this many nanoseconds of CPU time.
    Clock(i64),
    /// A stay off the CPU, whose amount is its nanoseconds.
    OffCpu,
    /// An event, counted under its program's name for events.
    Events(&'static str),
}

/// The session's probes from the command line's words: bpftrace's comma lists split,
/// each checked against this kernel before anything is launched.
pub fn parse_all(texts: &[String]) -> Result<Vec<Probe>> {
    // bpftrace's comma lists: `uprobe:./p:f,uprobe:./p:g` is two probes.
    let listed: Vec<&str> = texts
        .iter()
        .map(|text| probes::split_list(text).map_err(anyhow::Error::from))
        .collect::<Result<Vec<_>>>()?
        .concat();
    listed
        .iter()
        .map(|text| {
            if let Some(alloc) = AllocProbe::parse(text) {
                return Ok(Probe {
                    text: text.to_string(),
                    kind: ProbeKind::Heap(alloc?),
                });
            }
            let spec = probes::parse(text)?;
            // Fail before launching anything when this kernel cannot run the probe.
            match &spec {
                ProbeSpec::Kprobe(_) => probes::kprobe_support()?,
                ProbeSpec::Hardware { .. } => probes::hardware_support()?,
                _ => {}
            }
            Ok(Probe {
                text: text.to_string(),
                kind: ProbeKind::Event(spec),
            })
        })
        .collect()
}

/// The BPF program a probe of `kind` attaches.
pub fn event_program(kind: ProgramKind) -> EventProgram {
    match kind {
        ProgramKind::Uprobe => EventProgram::Uprobe,
        ProgramKind::Uretprobe => EventProgram::Uretprobe,
        ProgramKind::PerfEvent => EventProgram::PerfEvent,
        ProgramKind::Tracepoint => EventProgram::Tracepoint,
        ProgramKind::RawTracepoint => EventProgram::RawTracepoint,
        ProgramKind::Kprobe | ProgramKind::Kretprobe => EventProgram::Kprobe,
        ProgramKind::OffCpu => EventProgram::OffCpu,
        ProgramKind::Interval => EventProgram::Interval,
    }
}

/// Nanoseconds of CPU time one sample of a `profile` probe stands for.
fn clock_period_ns(spec: &ProbeSpec) -> Option<i64> {
    let ProbeSpec::Profile(rate) = spec else {
        return None;
    };
    let ns = match *rate {
        Rate::Hz(hz) => 1_000_000_000 / hz.max(1),
        Rate::Seconds(n) => n.saturating_mul(1_000_000_000),
        Rate::Millis(n) => n.saturating_mul(1_000_000),
        Rate::Micros(n) => n.saturating_mul(1_000),
    };
    i64::try_from(ns).ok()
}
