//! Perf events: the online CPUs, opening an event on each, and attaching a program to
//! an event's descriptor.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use libbpf_rs::{Link, PerfEventOpts, ProgramMut};

use crate::error::AttachError;
use crate::spec::{HardwareEvent, Sampling, SoftwareEvent};
use crate::sys;

/// A perf event to sample on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PerfEventKind {
    Software(SoftwareEvent),
    Hardware(HardwareEvent),
}

impl PerfEventKind {
    pub(crate) fn type_and_config(self) -> (u32, u64) {
        use perf_event_open_sys::bindings::{PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE};
        match self {
            PerfEventKind::Software(e) => (PERF_TYPE_SOFTWARE, e.config()),
            PerfEventKind::Hardware(e) => (PERF_TYPE_HARDWARE, e.config()),
        }
    }

    pub(crate) fn name(self) -> String {
        match self {
            PerfEventKind::Software(e) => format!("software:{e}"),
            PerfEventKind::Hardware(e) => format!("hardware:{e}"),
        }
    }
}

/// The online CPUs, from `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> Result<Vec<u32>, AttachError> {
    let text = fs::read_to_string("/sys/devices/system/cpu/online").map_err(|e| {
        AttachError::OnlineCpus {
            reason: e.to_string(),
        }
    })?;
    parse_cpu_list(&text).ok_or_else(|| AttachError::OnlineCpus {
        reason: format!("cannot parse '{}'", text.trim()),
    })
}

/// Parses a kernel CPU list such as `0-3,5,7-8`.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last): (u32, u32) = (first.parse().ok()?, last.parse().ok()?);
                if first > last {
                    return None;
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

pub(crate) fn perf_open_error(
    event: PerfEventKind,
    sampling: Sampling,
    cpu: i32,
    source: io::Error,
) -> AttachError {
    let errno = source.raw_os_error().unwrap_or(0);
    if let PerfEventKind::Hardware(event) = event {
        if errno == libc::ENOENT || errno == libc::EOPNOTSUPP {
            return AttachError::HardwareUnavailable { event };
        }
    }
    let hint = match (errno, sampling) {
        (libc::EACCES | libc::EPERM, _) => {
            let paranoid = fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into());
            format!(
                "; system-wide perf events need root or CAP_PERFMON \
                 (kernel.perf_event_paranoid is {paranoid})"
            )
        }
        (libc::EINVAL, Sampling::Frequency(hz)) => {
            match fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                Some(max) if hz > max => {
                    format!("; {hz} Hz is above kernel.perf_event_max_sample_rate ({max})")
                }
                _ => String::new(),
            }
        }
        _ => String::new(),
    };
    AttachError::PerfEventOpen {
        event: event.name(),
        cpu,
        source,
        hint,
    }
}

/// Opens `event` on each online CPU, system-wide (pid -1): the BPF program sees every
/// sample on the machine and filters by process itself. Events start disabled; they are
/// enabled when a program is attached.
pub fn open_perf_events_per_cpu(
    event: PerfEventKind,
    sampling: Sampling,
) -> Result<Vec<(u32, OwnedFd)>, AttachError> {
    let (type_, config) = event.type_and_config();
    online_cpus()?
        .into_iter()
        .map(|cpu| {
            sys::perf_event_open(type_, config, sampling, -1, cpu as i32)
                .map(|fd| (cpu, fd))
                .map_err(|e| perf_open_error(event, sampling, cpu as i32, e))
        })
        .collect()
}

pub(crate) fn attach_perf_fd(
    prog: &ProgramMut<'_>,
    fd: OwnedFd,
    cookie: u64,
    probe: impl FnOnce() -> String,
) -> Result<Link, AttachError> {
    let opts = PerfEventOpts {
        cookie,
        ..Default::default()
    };
    let link = prog
        .attach_perf_event_with_opts(fd.as_raw_fd(), opts)
        .map_err(|source| AttachError::Libbpf {
            probe: probe(),
            source,
        })?;
    // The link owns the descriptor now: libbpf closes it on detach. (On failure it
    // does not, and `fd` closes it above.)
    let _ = fd.into_raw_fd();
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-2,4,6-7"), Some(vec![0, 1, 2, 4, 6, 7]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn online_cpus_are_listed() {
        let cpus = online_cpus().unwrap();
        assert!(!cpus.is_empty());
    }
}
