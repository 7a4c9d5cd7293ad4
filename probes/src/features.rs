//! What this kernel (and this process's privileges) support, each with the reason when
//! not. Detection has no side effects: nothing is mounted or left attached.

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;

use libbpf_rs::ProgramType;

use crate::error::AttachError;
use crate::perf::online_cpus;
use crate::spec::Sampling;
use crate::sys;
use crate::tracefs::tracefs_root;

/// Whether one feature is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Available,
    /// Why not, in one line.
    Missing(String),
}

impl Support {
    pub fn is_available(&self) -> bool {
        matches!(self, Support::Available)
    }

    fn from_result(result: Result<(), String>) -> Self {
        match result {
            Ok(()) => Support::Available,
            Err(reason) => Support::Missing(reason),
        }
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Support::Available => f.write_str("yes"),
            Support::Missing(reason) => write!(f, "no: {reason}"),
        }
    }
}

/// What the kernel supports, as far as cargo-trace's probes are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// Loading BPF programs at all (program type kprobe, which uprobes use).
    pub bpf: Support,
    /// Kernel BTF at /sys/kernel/btf/vmlinux (CO-RE, tp_btf).
    pub btf: Support,
    pub uprobes: Support,
    pub kprobes: Support,
    pub tracepoints: Support,
    pub raw_tracepoints: Support,
    /// A system-wide software cpu-clock perf event (profile:hz:N).
    pub perf_cpu_clock: Support,
    /// Hardware perf events (a PMU).
    pub hardware_events: Support,
    /// `bpf_get_attach_cookie` for uprobe and perf_event programs.
    pub bpf_cookie: Support,
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = [
            ("bpf", &self.bpf),
            ("btf", &self.btf),
            ("uprobes", &self.uprobes),
            ("kprobes", &self.kprobes),
            ("tracepoints", &self.tracepoints),
            ("raw tracepoints", &self.raw_tracepoints),
            ("perf cpu-clock", &self.perf_cpu_clock),
            ("hardware events", &self.hardware_events),
            ("bpf cookie", &self.bpf_cookie),
        ];
        for (name, support) in rows {
            writeln!(f, "{name:16} {support}")?;
        }
        Ok(())
    }
}

/// Probes the running kernel. Takes a few milliseconds (reads /proc/kallsyms only when
/// kprobes look absent); needs the privileges attaching needs to give true answers.
pub fn features() -> Features {
    Features {
        bpf: Support::from_result(bpf_support()),
        btf: if Path::new("/sys/kernel/btf/vmlinux").is_file() {
            Support::Available
        } else {
            Support::Missing("no /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF is not set)".into())
        },
        uprobes: Support::from_result(uprobe_support()),
        kprobes: Support::from_result(kprobe_support().map_err(|e| e.to_string())),
        tracepoints: Support::from_result(tracepoint_support()),
        raw_tracepoints: Support::from_result(program_type_support(
            ProgramType::RawTracepoint,
            "raw tracepoint",
        )),
        perf_cpu_clock: Support::from_result(perf_cpu_clock_support()),
        hardware_events: Support::from_result(hardware_support().map_err(|e| e.to_string())),
        bpf_cookie: Support::from_result(bpf_cookie_support()),
    }
}

const NEED_PRIVILEGES: &str = "not permitted (needs root, or CAP_BPF and CAP_PERFMON)";

fn program_type_support(ty: ProgramType, what: &str) -> Result<(), String> {
    match ty.is_supported() {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("the kernel cannot load BPF {what} programs")),
        Err(e) if e.kind() == libbpf_rs::ErrorKind::PermissionDenied => {
            Err(format!("loading BPF programs is {NEED_PRIVILEGES}"))
        }
        Err(e) => Err(format!("probing BPF {what} programs failed: {e:#}")),
    }
}

fn bpf_support() -> Result<(), String> {
    if !Path::new("/proc/sys/kernel/unprivileged_bpf_disabled").exists()
        && !Path::new("/sys/fs/bpf").exists()
    {
        return Err("the kernel has no BPF syscall (CONFIG_BPF_SYSCALL is not set)".into());
    }
    program_type_support(ProgramType::Kprobe, "kprobe/uprobe")
}

fn bpf_cookie_support() -> Result<(), String> {
    for ty in [ProgramType::Kprobe, ProgramType::PerfEvent] {
        match ty.is_helper_supported(libbpf_rs::libbpf_sys::BPF_FUNC_get_attach_cookie) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "bpf_get_attach_cookie is not available to {ty:?} programs (needs Linux 5.15)"
                ))
            }
            Err(e) if e.kind() == libbpf_rs::ErrorKind::PermissionDenied => {
                return Err(format!("probing BPF helpers is {NEED_PRIVILEGES}"))
            }
            Err(e) => return Err(format!("probing bpf_get_attach_cookie failed: {e:#}")),
        }
    }
    Ok(())
}

fn pmu_exists(name: &str) -> bool {
    Path::new("/sys/bus/event_source/devices")
        .join(name)
        .join("type")
        .is_file()
}

fn uprobe_support() -> Result<(), String> {
    if pmu_exists("uprobe") || tracefs_root().is_some_and(|r| r.join("uprobe_events").exists()) {
        Ok(())
    } else {
        Err("the kernel has no uprobe events (CONFIG_UPROBE_EVENTS is not set)".into())
    }
}

/// Whether the kernel has kprobes, and if not, which config option is missing.
///
/// Kprobes are attached through the `kprobe` perf PMU (Linux 4.17+) or tracefs's
/// `kprobe_events`; with neither, `register_kprobe` in /proc/kallsyms tells apart a
/// kernel without kprobe events from one without kprobes at all.
pub fn kprobe_support() -> Result<(), AttachError> {
    if pmu_exists("kprobe") || tracefs_root().is_some_and(|r| r.join("kprobe_events").exists()) {
        return Ok(());
    }
    if kallsyms_has("register_kprobe") {
        Err(AttachError::KprobeEventsUnavailable)
    } else {
        Err(AttachError::KprobesUnavailable)
    }
}

fn kallsyms_has(symbol: &str) -> bool {
    let Ok(file) = fs::File::open("/proc/kallsyms") else {
        return false;
    };
    // Lines are "ADDRESS TYPE NAME [MODULE]".
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.split_whitespace().nth(2) == Some(symbol))
}

fn tracepoint_support() -> Result<(), String> {
    if !pmu_exists("tracepoint") {
        return Err("the kernel has no tracepoint events (CONFIG_TRACEPOINTS is not set)".into());
    }
    if tracefs_root().is_some() {
        return Ok(());
    }
    let mountable = fs::read_to_string("/proc/filesystems").is_ok_and(|fs| {
        fs.lines()
            .any(|l| l.split_whitespace().last() == Some("tracefs"))
    });
    if mountable {
        // attach_tracepoint mounts it.
        Ok(())
    } else {
        Err("tracefs is neither mounted nor known to the kernel (CONFIG_TRACING is not set)".into())
    }
}

fn perf_cpu_clock_support() -> Result<(), String> {
    use perf_event_open_sys::bindings::{PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};
    let cpu = online_cpus().map_err(|e| e.to_string())?[0];
    // System-wide on one CPU, as profiling opens it: this also checks the permission.
    sys::perf_event_open(
        PERF_TYPE_SOFTWARE,
        PERF_COUNT_SW_CPU_CLOCK.into(),
        Sampling::Frequency(99),
        -1,
        cpu as i32,
    )
    .map(drop)
    .map_err(|e| format!("perf_event_open(cpu-clock) on CPU {cpu} failed: {e}"))
}

/// Whether hardware perf events can be opened: fails with
/// [`AttachError::HardwareUnavailable`] where there is no PMU.
pub fn hardware_support() -> Result<(), AttachError> {
    use crate::perf::{open_perf_events_per_cpu, PerfEventKind};
    use crate::spec::HardwareEvent;
    let event = HardwareEvent::CpuCycles;
    open_perf_events_per_cpu(
        PerfEventKind::Hardware(event),
        Sampling::Period(event.default_period()),
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_kprobes_are_one_clear_line() {
        match kprobe_support() {
            Ok(()) => {
                eprintln!("SKIP: this kernel has kprobes, so their absence cannot be checked")
            }
            Err(e) if kallsyms_has("register_kprobe") => assert_eq!(
                e.to_string(),
                "kprobe events are not available on this kernel \
                 (CONFIG_KPROBE_EVENTS is not set); try a tracepoint"
            ),
            Err(e) => assert_eq!(
                e.to_string(),
                "kprobes are not available on this kernel (CONFIG_KPROBES is not set); \
                 try a tracepoint"
            ),
        }
    }

    #[test]
    fn missing_hardware_events_are_one_clear_line() {
        match hardware_support() {
            Ok(()) => eprintln!("SKIP: this machine has a PMU, so its absence cannot be checked"),
            Err(e @ AttachError::HardwareUnavailable { .. }) => assert_eq!(
                e.to_string(),
                "hardware perf events are not available on this machine (no PMU, e.g. in a VM); \
                 try software:cpu-clock or profile:hz"
            ),
            Err(AttachError::PerfEventOpen { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) =>
            {
                eprintln!("SKIP: system-wide perf events are not permitted here ({source})")
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn features_agree_with_the_detailed_checks() {
        let features = features();
        eprintln!("{features}");
        assert_eq!(features.to_string().lines().count(), 9);
        assert_eq!(
            features.kprobes,
            Support::from_result(kprobe_support().map_err(|e| e.to_string()))
        );
        assert_eq!(
            features.hardware_events.is_available(),
            hardware_support().is_ok()
        );
        // Every kernel cargo-trace targets has uprobes and BTF; these machines do.
        assert!(features.uprobes.is_available(), "{}", features.uprobes);
        for support in [&features.kprobes, &features.hardware_events] {
            if let Support::Missing(reason) = support {
                assert!(!reason.contains('\n'), "{reason}");
            }
        }
    }
}
