//! Attaching a loaded BPF program to each kind of probe, with a BPF cookie (read by the
//! program with `bpf_get_attach_cookie`) that tells the program which probe fired.
//!
//! Every function returns libbpf links: dropping a link detaches the program.

use libbpf_rs::{
    KprobeOpts, Link, ProgramMut, ProgramType, RawTracepointOpts, TracepointCategory,
    TracepointOpts, UprobeOpts,
};

use crate::bound::{attach_bound_uprobe, BoundUprobe, UprobeGroup};
use crate::error::{AttachError, Error};
use crate::features::kprobe_support;
use crate::notice::Notice;
use crate::perf::{
    attach_perf_fd, online_cpus, open_perf_events_per_cpu, perf_open_error, PerfEventKind,
};
use crate::resolve::{resolve_uprobe_with, resolve_usdt, ResolveOptions, UprobeTarget};
use crate::spec::{KprobeSpec, ProbeSpec, Rate, Sampling, SoftwareEvent};
use crate::sys;
use crate::tracefs::{check_tracepoint, ensure_tracefs, expand_tracepoints};
use crate::wildcard::has_wildcard;

fn check_program(
    prog: &ProgramMut<'_>,
    allowed: &[ProgramType],
    probe: &dyn Fn() -> String,
    expected: &'static str,
) -> Result<(), AttachError> {
    let found = prog.prog_type();
    if allowed.contains(&found) {
        return Ok(());
    }
    Err(AttachError::WrongProgramType {
        program: prog.name().to_string_lossy().into_owned(),
        found: format!("{found:?}"),
        probe: probe(),
        expected,
    })
}

/// Where a uprobe fires.
#[derive(Clone, Copy, Debug, Default)]
pub enum Fire<'a> {
    /// In every process that maps the file (the program filters).
    #[default]
    Everywhere,
    /// In this process only, all its threads (the kernel matches by address space), not
    /// its children.
    InProcess(u32),
    /// In these processes, their threads and every thread and process they start from
    /// now on ([`crate::bound`]); in no other.
    InDescendants {
        group: &'a UprobeGroup,
        processes: &'a [u32],
    },
}

/// An attached probe; dropping it detaches it.
#[derive(Debug)]
pub enum Attachment {
    Link(Link),
    Bound(BoundUprobe),
}

impl From<Link> for Attachment {
    fn from(link: Link) -> Attachment {
        Attachment::Link(link)
    }
}

/// Attaches a uprobe (or uretprobe) program at a resolved target, firing where `fire`
/// says.
pub fn attach_uprobe_in(
    prog: &ProgramMut<'_>,
    target: &UprobeTarget,
    fire: Fire<'_>,
    retprobe: bool,
    cookie: u64,
) -> Result<Attachment, AttachError> {
    match fire {
        Fire::Everywhere => attach_uprobe(prog, target, None, retprobe, cookie).map(Into::into),
        Fire::InProcess(pid) => {
            attach_uprobe(prog, target, Some(pid as i32), retprobe, cookie).map(Into::into)
        }
        Fire::InDescendants { group, processes } => {
            check_uprobe_program(prog, target, retprobe)?;
            attach_bound_uprobe(prog, &[target], group, processes, retprobe, cookie)
                .map(Attachment::Bound)
        }
    }
}

/// [`attach_uprobe_in`] at several targets with the same cookie. Bound to processes
/// ([`Fire::InDescendants`]), the targets are one event of the kernel: one attachment,
/// and one wait of the kernel's (~70 ms) to detach them all. Targets at the same
/// instruction count once.
pub fn attach_uprobes_in(
    prog: &ProgramMut<'_>,
    targets: &[UprobeTarget],
    fire: Fire<'_>,
    retprobe: bool,
    cookie: u64,
) -> Result<Vec<Attachment>, AttachError> {
    let mut distinct: Vec<&UprobeTarget> = Vec::new();
    for target in targets {
        let seen = distinct
            .iter()
            .any(|t| t.path == target.path && t.file_offset == target.file_offset);
        if !seen {
            distinct.push(target);
        }
    }
    match fire {
        Fire::InDescendants { group, processes } if !distinct.is_empty() => {
            check_uprobe_program(prog, distinct[0], retprobe)?;
            let bound = attach_bound_uprobe(prog, &distinct, group, processes, retprobe, cookie)?;
            Ok(vec![Attachment::Bound(bound)])
        }
        _ => distinct
            .into_iter()
            .map(|target| attach_uprobe_in(prog, target, fire, retprobe, cookie))
            .collect(),
    }
}

fn check_uprobe_program(
    prog: &ProgramMut<'_>,
    target: &UprobeTarget,
    retprobe: bool,
) -> Result<(), AttachError> {
    check_program(
        prog,
        &[ProgramType::Kprobe],
        &|| describe_uprobe(target, retprobe),
        "a uprobe program (SEC(\"uprobe\") or SEC(\"uretprobe\"))",
    )
}

fn describe_uprobe(target: &UprobeTarget, retprobe: bool) -> String {
    format!(
        "{} {}:{} (file offset {:#x})",
        if retprobe { "uretprobe" } else { "uprobe" },
        target.path.display(),
        target.symbol,
        target.file_offset
    )
}

/// Attaches a uprobe (or uretprobe) program at a resolved target.
///
/// `pid`: only that process hits the probe (`None`: every process that maps the file,
/// left for the program to filter). A USDT semaphore, if the target has one, is
/// incremented by the kernel while attached.
pub fn attach_uprobe(
    prog: &ProgramMut<'_>,
    target: &UprobeTarget,
    pid: Option<i32>,
    retprobe: bool,
    cookie: u64,
) -> Result<Link, AttachError> {
    let describe = || describe_uprobe(target, retprobe);
    check_uprobe_program(prog, target, retprobe)?;
    let opts = UprobeOpts {
        ref_ctr_offset: target.ref_ctr_offset.unwrap_or(0) as usize,
        cookie,
        retprobe,
        func_name: None,
        ..Default::default()
    };
    prog.attach_uprobe_with_opts(
        pid.unwrap_or(-1),
        &target.path,
        target.file_offset as usize,
        opts,
    )
    .map_err(|source| {
        // ENOTSUPP (524, a kernel-internal errno std does not name): the kernel's
        // uprobes cannot run the instruction there (its tables refuse many AVX ones).
        if format!("{source:#}").ends_with("(os error 524)") {
            AttachError::InstructionRefused { probe: describe() }
        } else {
            AttachError::Libbpf {
                probe: describe(),
                source,
            }
        }
    })
}

/// Samples `event` on every online CPU and runs a perf_event program on each sample:
/// one link per CPU. `profile:hz:N` is `Software(CpuClock)` with `Frequency(N)`.
///
/// The events are system-wide (pid -1, one per CPU): the program must filter by tgid.
/// Hardware events fail with [`AttachError::HardwareUnavailable`] where there is no PMU.
pub fn attach_perf_event_per_cpu(
    prog: &ProgramMut<'_>,
    event: PerfEventKind,
    sampling: Sampling,
    cookie: u64,
) -> Result<Vec<Link>, AttachError> {
    let probe = || format!("{} ({sampling:?})", event.name());
    check_program(
        prog,
        &[ProgramType::PerfEvent],
        &probe,
        "a perf_event program (SEC(\"perf_event\"))",
    )?;
    open_perf_events_per_cpu(event, sampling)?
        .into_iter()
        .map(|(cpu, fd)| attach_perf_fd(prog, fd, cookie, || format!("{} on CPU {cpu}", probe())))
        .collect()
}

/// `profile:UNIT:N`: a cpu-clock event per CPU at `rate`.
pub fn attach_profile(
    prog: &ProgramMut<'_>,
    rate: Rate,
    cookie: u64,
) -> Result<Vec<Link>, AttachError> {
    attach_perf_event_per_cpu(
        prog,
        PerfEventKind::Software(SoftwareEvent::CpuClock),
        rate.sampling(),
        cookie,
    )
}

/// `interval:UNIT:N`: one cpu-clock event at `rate` on the first online CPU (as
/// bpftrace does), so the program runs at `rate` whatever the machine's size.
pub fn attach_interval(
    prog: &ProgramMut<'_>,
    rate: Rate,
    cookie: u64,
) -> Result<Link, AttachError> {
    let event = PerfEventKind::Software(SoftwareEvent::CpuClock);
    let probe = || format!("interval:{rate}");
    check_program(
        prog,
        &[ProgramType::PerfEvent],
        &probe,
        "a perf_event program (SEC(\"perf_event\"))",
    )?;
    let cpu = online_cpus()?[0] as i32;
    let (type_, config) = event.type_and_config();
    let fd = sys::perf_event_open(type_, config, rate.sampling(), -1, cpu)
        .map_err(|e| perf_open_error(event, rate.sampling(), cpu, e))?;
    attach_perf_fd(prog, fd, cookie, probe)
}

/// Attaches a tracepoint program to `category:name`, mounting tracefs if needed.
/// A tracepoint this kernel lacks fails with [`AttachError::NoTracepoint`].
pub fn attach_tracepoint(
    prog: &ProgramMut<'_>,
    category: &str,
    name: &str,
    cookie: u64,
) -> Result<Link, AttachError> {
    let probe = || format!("tracepoint:{category}:{name}");
    check_program(
        prog,
        &[ProgramType::Tracepoint],
        &probe,
        "a tracepoint program (SEC(\"tracepoint\"))",
    )?;
    let root = ensure_tracefs()?;
    check_tracepoint(&root, category, name)?;
    let opts = TracepointOpts {
        cookie,
        ..Default::default()
    };
    prog.attach_tracepoint_with_opts(TracepointCategory::Custom(category.to_string()), name, opts)
        .map_err(|source| AttachError::Libbpf {
            probe: probe(),
            source,
        })
}

/// Attaches a raw tracepoint program to tracepoint `name` (no category).
pub fn attach_raw_tracepoint(
    prog: &ProgramMut<'_>,
    name: &str,
    cookie: u64,
) -> Result<Link, AttachError> {
    let probe = || format!("rawtracepoint:{name}");
    check_program(
        prog,
        &[
            ProgramType::RawTracepoint,
            ProgramType::RawTracepointWritable,
        ],
        &probe,
        "a raw tracepoint program (SEC(\"raw_tp\"))",
    )?;
    let opts = RawTracepointOpts {
        cookie,
        ..Default::default()
    };
    prog.attach_raw_tracepoint_with_opts(name, opts)
        .map_err(|source| match source.kind() {
            libbpf_rs::ErrorKind::NotFound => AttachError::NoRawTracepoint {
                name: name.to_string(),
            },
            _ => AttachError::Libbpf {
                probe: probe(),
                source,
            },
        })
}

/// Attaches a kprobe or kretprobe program. On a kernel without kprobes this fails,
/// before touching the program, with [`AttachError::KprobesUnavailable`].
pub fn attach_kprobe(
    prog: &ProgramMut<'_>,
    spec: &KprobeSpec,
    cookie: u64,
) -> Result<Link, AttachError> {
    kprobe_support()?;
    let probe = || spec.to_string();
    check_program(
        prog,
        &[ProgramType::Kprobe],
        &probe,
        "a kprobe program (SEC(\"kprobe\") or SEC(\"kretprobe\"))",
    )?;
    if spec.offset != 0 {
        return Err(AttachError::Unsupported {
            what: "kprobe offsets (kprobe:FUNCTION+OFFSET)".into(),
        });
    }
    // The kernel finds module functions by name too; the module only disambiguates
    // for bpftrace's listing.
    let opts = KprobeOpts {
        cookie,
        ..Default::default()
    };
    prog.attach_kprobe_with_opts(spec.retprobe, &spec.function, opts)
        .map_err(|source| AttachError::Libbpf {
            probe: probe(),
            source,
        })
}

/// Resolves and attaches any probe: the one entry point for a caller holding a spec.
///
/// `prog` must be of [`ProbeSpec::program_kind`]. `pid` is the process the probe is for:
/// library names resolve in its mappings and uprobes fire only in it (forked children
/// included only if they share its memory; to follow forks, see [`attach_probe_with`]).
/// Perf events are system-wide whatever `pid` is.
///
/// Patterns attach several links (one per function, tracepoint or CPU). Notices are
/// dropped: see [`attach_probe_with`] for them.
pub fn attach_probe(
    prog: &ProgramMut<'_>,
    spec: &ProbeSpec,
    pid: Option<u32>,
    cookie: u64,
) -> Result<Vec<Attachment>, Error> {
    attach_probe_for(prog, spec, pid, pid, cookie)
}

/// [`attach_probe`] with names resolved for process `resolve_in` but uprobes firing in
/// `fire_in` only (`None`: every process that maps the file).
pub fn attach_probe_for(
    prog: &ProgramMut<'_>,
    spec: &ProbeSpec,
    resolve_in: Option<u32>,
    fire_in: Option<u32>,
    cookie: u64,
) -> Result<Vec<Attachment>, Error> {
    let options = AttachOptions {
        resolve_in,
        fire: fire_in.map_or(Fire::Everywhere, Fire::InProcess),
        unsafe_addresses: false,
    };
    Ok(attach_probe_with(prog, spec, &options, cookie)?.links)
}

/// For whom and how [`attach_probe_with`] attaches a probe.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttachOptions<'a> {
    /// The process names resolve for (its mappings, its executable, its mount
    /// namespace); probes on files it does not map get a [`Notice::NotMapped`].
    pub resolve_in: Option<u32>,
    /// Where uprobes (and USDT probes) fire.
    pub fire: Fire<'a>,
    /// See [`ResolveOptions::unsafe_addresses`].
    pub unsafe_addresses: bool,
}

/// What [`attach_probe_with`] attached, and what the user should know about it.
pub struct Attached {
    /// Dropping one detaches it.
    pub links: Vec<Attachment>,
    pub notices: Vec<Notice>,
}

/// Resolves and attaches any probe, saying what the user should know: a probe on a
/// file the process does not map, an IFUNC's implementation probed in its place.
pub fn attach_probe_with(
    prog: &ProgramMut<'_>,
    spec: &ProbeSpec,
    options: &AttachOptions<'_>,
    cookie: u64,
) -> Result<Attached, Error> {
    let pid = options.resolve_in;
    let fire = options.fire;
    let mut notices = Vec::new();
    let links: Vec<Link> = match spec {
        ProbeSpec::Uprobe(u) => {
            let resolve = ResolveOptions {
                pid,
                unsafe_addresses: options.unsafe_addresses,
            };
            let resolution = resolve_uprobe_with(u, &resolve)?;
            let targets = resolution.targets;
            notices.extend(resolution.notices);
            notices.extend(not_mapped(spec, &targets, pid));
            let links = attach_uprobes_in(prog, &targets, fire, u.retprobe, cookie)?;
            return Ok(Attached { links, notices });
        }
        ProbeSpec::Usdt(u) => {
            let targets = resolve_usdt(u, pid)?;
            notices.extend(not_mapped(spec, &targets, pid));
            let links = attach_uprobes_in(prog, &targets, fire, false, cookie)?;
            return Ok(Attached { links, notices });
        }
        ProbeSpec::Profile(rate) => attach_profile(prog, *rate, cookie)?,
        ProbeSpec::Interval(rate) => vec![attach_interval(prog, *rate, cookie)?],
        ProbeSpec::Tracepoint { category, name } => {
            if has_wildcard(category) || has_wildcard(name) {
                expand_tracepoints(category, name)?
                    .iter()
                    .map(|(c, n)| attach_tracepoint(prog, c, n, cookie))
                    .collect::<Result<_, _>>()?
            } else {
                vec![attach_tracepoint(prog, category, name, cookie)?]
            }
        }
        ProbeSpec::RawTracepoint { name, .. } => vec![attach_raw_tracepoint(prog, name, cookie)?],
        ProbeSpec::OffCpu => vec![attach_raw_tracepoint(prog, "sched_switch", cookie)?],
        ProbeSpec::Kprobe(k) => vec![attach_kprobe(prog, k, cookie)?],
        ProbeSpec::Software { event, period } => attach_perf_event_per_cpu(
            prog,
            PerfEventKind::Software(*event),
            Sampling::Period(*period),
            cookie,
        )?,
        ProbeSpec::Hardware { event, period } => attach_perf_event_per_cpu(
            prog,
            PerfEventKind::Hardware(*event),
            Sampling::Period(*period),
            cookie,
        )?,
    };
    Ok(Attached {
        links: links.into_iter().map(Into::into).collect(),
        notices,
    })
}

/// A notice for each file of `targets` that process `pid` does not map.
fn not_mapped(spec: &ProbeSpec, targets: &[UprobeTarget], pid: Option<u32>) -> Vec<Notice> {
    let Some(pid) = pid else {
        return Vec::new();
    };
    let Some(mapped) = crate::maps::MappedFiles::of(pid) else {
        return Vec::new();
    };
    let mut notices: Vec<Notice> = Vec::new();
    for target in targets {
        let known = notices
            .iter()
            .any(|n| matches!(n, Notice::NotMapped { path, .. } if *path == target.path));
        if !known && !mapped.contains(&target.path) {
            notices.push(Notice::NotMapped {
                probe: spec.to_string(),
                path: target.path.clone(),
                pid,
                static_target: !mapped.has_shared_libraries(),
            });
        }
    }
    notices
}
