//! Uprobes bound to processes and to everything they start: untraced processes pay
//! nothing.
//!
//! A uprobe attached the usual way for "every process" makes the kernel patch the probed
//! instruction in every process that maps the file, and each of them then traps at every
//! call, only for the program to ignore the event: while a session probed libc's malloc,
//! an unrelated program's mallocs ran 80 times slower. Bound to one process (libbpf's
//! `pid`), the uprobe stays out of the others, but also out of the children the process
//! starts, and libbpf's uprobe perf event cannot be inherited (the kernel reads its path
//! from the opener's memory again at every fork: the fork fails with EFAULT).
//!
//! So a bound uprobe is a tracefs uprobe event (`uprobe_events`), in a group named after
//! the session's process, opened as a perf tracepoint event on each thread of the traced
//! processes with `inherit`: the kernel copies the event into every thread and process
//! they create, before it runs, and patches the probed instruction only in the address
//! spaces of tasks that hold one of the event's perf events (`uprobe_perf_filter`). The
//! program is attached to one more perf event of the event, not inherited; the kernel
//! runs it at each hit of the event, in whichever traced task. (Attached to an inherited
//! one, the program would be copied into each copy of the event, and the first of them
//! to go, with its thread or process, would take the program off the event for all.)
//! The inherited perf events sample READ, which keeps the kernel from swapping them
//! between a parent and a child at a context switch (a child that exited with its
//! parent's events would have taken the parent out of the filter).
//! Dropping a [`BoundUprobe`] closes the perf events, which removes the breakpoints, and
//! then deletes the tracefs event.
//!
//! tracefs events outlive a process killed before it deletes them: whoever cleans up
//! after a session that died deletes its whole group ([`UprobeGroup::removal`]); a new
//! group also deletes the groups of processes that are gone.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libbpf_rs::{Link, ProgramMut};

use crate::error::AttachError;
use crate::perf::attach_perf_fd;
use crate::resolve::UprobeTarget;
use crate::sys;
use crate::tracefs::ensure_tracefs;

/// The groups' names: this prefix and the pid of the process that made the events.
const GROUP_PREFIX: &str = "cargo_trace_";
/// How long deleting an event waits for the kernel to let go of its last perf event.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(2);

/// Names the events of one group apart, across the process.
static NEXT_EVENT: AtomicU32 = AtomicU32::new(0);

/// The tracefs group of this process's bound uprobes.
#[derive(Debug, Clone)]
pub struct UprobeGroup {
    /// `uprobe_events` in tracefs.
    control: PathBuf,
    /// `events/` in tracefs.
    events: PathBuf,
    name: String,
}

impl UprobeGroup {
    /// The group of this process, tracefs mounted if it was not. Deletes what groups of
    /// processes that are gone left behind.
    pub fn new() -> Result<UprobeGroup, AttachError> {
        let root = ensure_tracefs()?;
        let control = root.join("uprobe_events");
        if !control.exists() {
            return Err(AttachError::Tracefs {
                reason: format!(
                    "{} is missing (CONFIG_UPROBE_EVENTS is not set)",
                    control.display()
                ),
            });
        }
        let group = UprobeGroup {
            events: root.join("events"),
            name: group_name(std::process::id()),
            control,
        };
        // In the background: deleting a group whose events a process is still letting go
        // of (a session just ended releases its links after it is gone) waits for that.
        let orphans = UprobeGroup {
            control: group.control.clone(),
            events: group.events.clone(),
            name: group.name.clone(),
        };
        std::thread::spawn(move || orphans.remove_orphans());
        Ok(group)
    }

    /// The group's name in tracefs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What deletes every event of the group at once: the command to write to the file.
    /// For a process cleaning up after this one died (it may not be able to allocate
    /// then: both are made beforehand).
    pub fn removal(&self) -> (PathBuf, String) {
        (self.control.clone(), format!("-:{}/", self.name))
    }

    /// Deletes the groups of processes that no longer exist (killed before they could).
    fn remove_orphans(&self) {
        let Ok(defined) = fs::read_to_string(&self.control) else {
            return;
        };
        let mut orphans: Vec<&str> = defined
            .lines()
            .filter_map(|line| line.split_once(':')?.1.split_once('/'))
            .map(|(group, _)| group)
            .filter(|group| {
                group
                    .strip_prefix(GROUP_PREFIX)
                    .and_then(|pid| pid.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            })
            .collect();
        orphans.dedup();
        for group in orphans {
            let _ = write_command(&self.control, &format!("-:{group}/"));
        }
    }

    /// Defines one uprobe (or uretprobe) event at every one of `targets`: the kernel
    /// fires it at each, and a perf event of it (and the wait for the kernel to let go of
    /// it, ~70 ms) covers them all.
    fn define(
        &self,
        targets: &[&UprobeTarget],
        retprobe: bool,
    ) -> Result<UprobeEvent, AttachError> {
        let name = format!("p{}", NEXT_EVENT.fetch_add(1, Ordering::Relaxed));
        let mut event: Option<UprobeEvent> = None;
        for target in targets {
            // The kernel splits the command at white space: a path with some is named
            // through a descriptor of ours, which it resolves to the file.
            let (path, _file) = if target.path.to_string_lossy().contains(char::is_whitespace) {
                let file =
                    fs::File::open(&target.path).map_err(|e| tracefs_error(&self.control, e))?;
                let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
                (path, Some(file))
            } else {
                (target.path.display().to_string(), None)
            };
            let semaphore = target
                .ref_ctr_offset
                .map(|offset| format!("({offset:#x})"))
                .unwrap_or_default();
            // The same event name again adds a probe to the event.
            let command = format!(
                "{}:{}/{name} {path}:{:#x}{semaphore}",
                if retprobe { 'r' } else { 'p' },
                self.name,
                target.file_offset,
            );
            write_command(&self.control, &command).map_err(|e| AttachError::UprobeEvent {
                command: command.clone(),
                source: e,
            })?;
            // Deleted on drop from here on, should anything after fail.
            event.get_or_insert_with(|| UprobeEvent {
                control: self.control.clone(),
                removal: format!("-:{}/{name}", self.name),
                id: 0,
            });
        }
        let mut event = event.ok_or_else(|| AttachError::Tracefs {
            reason: "no uprobe to define".into(),
        })?;
        let id_path = self.events.join(&self.name).join(&name).join("id");
        event.id = fs::read_to_string(&id_path)
            .ok()
            .and_then(|id| id.trim().parse().ok())
            .ok_or_else(|| AttachError::Tracefs {
                reason: format!("cannot read {}", id_path.display()),
            })?;
        Ok(event)
    }
}

fn tracefs_error(control: &Path, error: io::Error) -> AttachError {
    AttachError::Tracefs {
        reason: format!("{}: {error}", control.display()),
    }
}

/// The name of the group of process `pid`'s bound uprobes.
pub fn group_name(pid: u32) -> String {
    format!("{GROUP_PREFIX}{pid}")
}

/// Appends one command to tracefs's `uprobe_events` (never truncating it: that would
/// delete every other tool's events).
fn write_command(control: &Path, command: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new().append(true).open(control)?;
    file.write_all(command.as_bytes())
}

/// A tracefs uprobe event, deleted on drop (once no perf event holds it).
#[derive(Debug)]
struct UprobeEvent {
    control: PathBuf,
    removal: String,
    id: u64,
}

/// Set once links are detached in the background ([`crate::detach_in_background`]):
/// their perf events are open in another process until it deletes the events itself,
/// so a removal here is tried once, not waited for.
static REMOVAL_DEFERRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn defer_removal() {
    REMOVAL_DEFERRED.store(true, std::sync::atomic::Ordering::SeqCst);
}

impl Drop for UprobeEvent {
    fn drop(&mut self) {
        // Busy while a perf event of it is being released: tried again for a while.
        let deadline = std::time::Instant::now() + REMOVAL_PATIENCE;
        loop {
            match write_command(&self.control, &self.removal) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    if REMOVAL_DEFERRED.load(std::sync::atomic::Ordering::SeqCst)
                        || std::time::Instant::now() > deadline
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => return,
            }
        }
    }
}

/// A uprobe that fires only in the processes it was bound to, their threads, and every
/// thread and process they start after; detached on drop.
#[derive(Debug)]
pub struct BoundUprobe {
    /// The program, attached to a perf event of its own (on the first thread, not
    /// inherited).
    link: Option<Link>,
    /// The inherited perf events, one per thread: where the uprobe fires.
    inherited: Vec<OwnedFd>,
    /// Dropped last: the event cannot be deleted while a perf event holds it.
    event: Option<UprobeEvent>,
}

impl Drop for BoundUprobe {
    fn drop(&mut self) {
        drop(self.link.take());
        self.inherited.clear();
        drop(self.event.take());
    }
}

/// Attaches `prog` at every one of `targets` (distinct instructions) for every thread of
/// `processes` and every thread and process they start from now on, with `cookie`. The
/// program fires in no other process.
///
/// Threads that a process starts while this runs are looked for again until none is
/// new. A process that is gone is skipped; that all are is an error.
pub fn attach_bound_uprobe(
    prog: &ProgramMut<'_>,
    targets: &[&UprobeTarget],
    group: &UprobeGroup,
    processes: &[u32],
    retprobe: bool,
    cookie: u64,
) -> Result<BoundUprobe, AttachError> {
    let event = group.define(targets, retprobe)?;
    let describe = || {
        let first = targets[0];
        format!(
            "{} {}:{} (file offset {:#x}){}",
            if retprobe { "uretprobe" } else { "uprobe" },
            first.path.display(),
            first.symbol,
            first.file_offset,
            match targets.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            }
        )
    };
    let mut bound = Vec::new();
    let mut fds = Vec::new();
    let mut first = None;
    loop {
        let tasks: Vec<u32> = processes
            .iter()
            .flat_map(|&pid| threads_of(pid))
            .filter(|tid| !bound.contains(tid))
            .collect();
        if tasks.is_empty() {
            break;
        }
        for tid in tasks {
            bound.push(tid);
            let mut opened = sys::open_tracepoint(event.id, tid as i32, true);
            if matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::EMFILE))
                && sys::raise_open_files_limit()
            {
                opened = sys::open_tracepoint(event.id, tid as i32, true);
            }
            match opened {
                Ok(fd) => {
                    fds.push(fd);
                    first.get_or_insert(tid);
                }
                // Exited since it was listed.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(open_error(source, tid, &describe)),
            }
        }
    }
    let gone = || AttachError::ProcessesGone {
        probe: describe(),
        processes: processes.to_vec(),
    };
    let first = first.ok_or_else(gone)?;
    let carrier = sys::open_tracepoint(event.id, first as i32, false)
        .map_err(|source| open_error(source, first, &describe))?;
    let link = attach_perf_fd(prog, carrier, cookie, describe)?;
    Ok(BoundUprobe {
        link: Some(link),
        inherited: fds,
        event: Some(event),
    })
}

/// Why the perf event of a bound uprobe could not be opened on thread `tid`.
fn open_error(source: io::Error, tid: u32, describe: &dyn Fn() -> String) -> AttachError {
    // ENOTSUPP (524, a kernel-internal errno std does not name): the kernel's uprobes
    // cannot run the instruction there (its tables refuse many AVX ones).
    if source.raw_os_error() == Some(524) {
        return AttachError::InstructionRefused { probe: describe() };
    }
    AttachError::PerfEventOpen {
        event: format!("{} in thread {tid}", describe()),
        cpu: -1,
        source,
        hint: String::new(),
    }
}

/// The threads of process `pid` (none if it is gone).
fn threads_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_carry_the_pid() {
        assert_eq!(group_name(42), "cargo_trace_42");
    }

    #[test]
    fn a_new_group_deletes_the_events_of_processes_that_are_gone() {
        // Above any pid_max: no such process ever runs.
        let orphan = group_name(999_999_999);
        let control = crate::tracefs::tracefs_root().map(|root| root.join("uprobe_events"));
        let exe = std::env::current_exe().unwrap();
        let defined = control.as_ref().map(|control| {
            write_command(control, &format!("p:{orphan}/p0 {}:0x1000", exe.display()))
        });
        let Some((control, Ok(()))) = control.zip(defined) else {
            eprintln!("skipping: defining a uprobe event in tracefs needs root");
            return;
        };
        assert!(fs::read_to_string(&control).unwrap().contains(&orphan));
        let group = UprobeGroup::new().unwrap();
        // Deleted from a thread of its own (see `new`): soon, not at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut left = fs::read_to_string(&control).unwrap();
        while left.contains(&orphan) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            left = fs::read_to_string(&control).unwrap();
        }
        assert!(!left.contains(&orphan), "{left}");
        assert!(group.removal().1.ends_with('/'));
    }

    #[test]
    fn the_threads_of_a_process_are_listed() {
        let pid = std::process::id();
        let (started, wait) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            started.send(()).unwrap();
            let _ = stopped.recv();
        });
        wait.recv().unwrap();
        let threads = threads_of(pid);
        stop.send(()).unwrap();
        thread.join().unwrap();
        assert!(threads.contains(&pid) && threads.len() >= 2, "{threads:?}");
        assert!(threads_of(u32::MAX).is_empty());
    }
}
