//! Following the target's children: processes it forks are traced too, and one that
//! execs (or dlopens) is held stopped until its new mappings are registered.
//!
//! The BPF side ([`Tracer::follow_forks`], `on_start_main`) adds forked children to the
//! pid filter and stops a traced process whose link map just became consistent, reporting
//! its pid through a ring buffer. This module owns that ring buffer, the links of the
//! programs, the cookie the ld.so probe needs, and the rule that every process reported
//! stopped is continued with SIGCONT: after its mappings are registered
//! ([`Children::register_started`]), or, at the latest, when the [`Children`] drop.

use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::rc::Rc;

use anyhow::{Context, Result};
use bpf_prog::Tracer;
use libbpf_rs::RingBuffer;
use probes::{Attachment, Fire, ProbeSpec};

use super::store::KernelTables;
use crate::tables::{ProcessTables, StoreId};

/// Where ld.so tells debuggers that its link map changed.
const LD_SO_HOOK: &str = "uprobe:ld-linux-x86-64.so.2:_dl_debug_state";
/// Before `main`, for a child whose ld.so was not probed.
const START_MAIN_HOOK: &str = "uprobe:libc:__libc_start_main";

/// The children of the target being followed.
pub struct Children {
    /// The fork/exec programs and the stop hooks; dropped first, so that no process
    /// stops once the last reports are read.
    links: Vec<Attachment>,
    /// Reports processes stopped for registration.
    ring: RingBuffer<'static>,
    /// What the ring reported, not registered and continued yet.
    started: Rc<RefCell<Vec<u32>>>,
}

impl Children {
    /// Starts following the children of `pid`. `attached` (`-p`): the attached process
    /// itself is never stopped, so the ld.so hook, which stops any traced process after
    /// a dlopen, is left out. `fire`: where the hooks' uprobes fire.
    pub fn follow(tracer: &Tracer, pid: u32, attached: bool, fire: Fire<'_>) -> Result<Children> {
        let mut links: Vec<Attachment> = tracer
            .follow_forks()
            .context("following the target's children")?
            .into_iter()
            .map(Attachment::from)
            .collect();
        links.extend(stop_hooks(tracer, pid, attached, fire)?);
        let started = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&started);
        let ring = tracer.new_images(move |pid| sink.borrow_mut().push(pid))?;
        Ok(Children {
            links,
            ring,
            started,
        })
    }

    /// Readable when a child stopped at its start was reported: what
    /// [`Children::take_reports`] reads.
    pub fn reports_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the ring buffer's epoll descriptor lives as long as the ring, which
        // the returned borrow cannot outlive.
        unsafe { BorrowedFd::borrow_raw(self.ring.epoll_fd()) }
    }

    /// Takes the reports of children stopped at their start, without waiting.
    pub fn take_reports(&self) {
        let _ = self.ring.consume();
    }

    /// Registers the mappings of every process reported stopped, lets `registered` act
    /// on it while it is still stopped (attach probes on libraries it just mapped), and
    /// continues it.
    pub fn register_started(
        &self,
        store: &mut KernelTables<'_>,
        tables: &mut ProcessTables,
        mut registered: impl FnMut(&Tracer, u32),
    ) {
        for pid in self.started.borrow_mut().drain(..) {
            tables.forget(StoreId::Kernel, pid);
            // The process may be gone already: nothing to register then.
            let _ = tables.sync(store, pid);
            registered(store.tracer, pid);
            resume(pid);
        }
    }
}

impl Children {
    /// The links, taken to be detached with the probes' (closing one waits for the
    /// kernel's RCU grace periods: together, the waits overlap). No process stops
    /// once they are gone.
    pub fn take_links(&mut self) -> Vec<Attachment> {
        std::mem::take(&mut self.links)
    }
}

impl Drop for Children {
    /// No process stops once the links are gone; one that stopped since the last poll
    /// must not stay stopped.
    fn drop(&mut self) {
        self.links.clear();
        let _ = self.ring.consume();
        for pid in self.started.borrow_mut().drain(..) {
            resume(pid);
        }
    }
}

fn resume(pid: u32) {
    // SAFETY: kill(2) with a pid the program reported; at worst the process is gone.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// Attaches the program that stops an exec'd child once ld.so has mapped its libraries,
/// where `fire` says (the program picks the followed processes): at ld.so's `_dl_debug_state`
/// when the link map turns consistent (before relocation ends and before any library
/// constructor runs), and, failing that, at libc's `__libc_start_main` (before `main`).
/// Children that use neither the target's ld.so nor its libc are registered by polling.
fn stop_hooks(
    tracer: &Tracer,
    pid: u32,
    attached: bool,
    fire: Fire<'_>,
) -> Result<Vec<Attachment>> {
    let hooks: &[&str] = if attached {
        &[START_MAIN_HOOK]
    } else {
        &[LD_SO_HOOK, START_MAIN_HOOK]
    };
    let mut links = Vec::new();
    for &probe in hooks {
        let spec = match probes::parse(probe) {
            Ok(ProbeSpec::Uprobe(spec)) => spec,
            _ => unreachable!("a valid uprobe spec"),
        };
        // A static target has neither: polling alone then.
        let Ok(targets) = probes::resolve_uprobe(&spec, Some(pid)) else {
            continue;
        };
        for target in &targets {
            let cookie = if probe == LD_SO_HOOK {
                match r_debug_cookie(&target.path, target.address) {
                    Some(cookie) => cookie,
                    None => continue,
                }
            } else {
                bpf_prog::START_MAIN_COOKIE
            };
            let link =
                probes::attach_uprobe_in(tracer.start_main_program(), target, fire, false, cookie)?;
            links.push(link);
        }
    }
    Ok(links)
}

/// The cookie of the ld.so hook: `_r_debug`'s address in ld.so `path` minus
/// `_dl_debug_state`'s (`debug_state`), as the two's complement the program adds to the
/// probed pc to read `r_debug.r_state`.
fn r_debug_cookie(path: &Path, debug_state: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let r_debug = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.name() == Ok("_r_debug"))?
        .address();
    Some(r_debug.wrapping_sub(debug_state))
}
