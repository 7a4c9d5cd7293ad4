//! Start a target stopped at its ELF entry point, so probes are live before `main`.
//!
//! The child asks to be traced and execs; the kernel stops it after exec. We
//! plant an `int3` at `AT_ENTRY` (read from /proc/PID/auxv) and continue: when
//! it traps, ld.so has mapped every DT_NEEDED library but no code of the program
//! has run. The caller loads tables and attaches probes, then [`Stopped::resume`]
//! restores the instruction and detaches, and the target runs at full speed.

use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{bail, Context, Result};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// A freshly started target, stopped at its entry point under ptrace.
pub struct Stopped {
    pid: Pid,
    entry: u64,
    saved_word: i64,
}

/// How the target ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The exit code cargo-trace passes on: the target's, or 128 + signal like a shell.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal(signal) => 128 + signal,
        }
    }
}

/// Start `argv` traced, with `env` added to its environment, and run it up to its entry
/// point.
pub fn start(argv: &[String], env: &[(&str, std::ffi::OsString)]) -> Result<Stopped> {
    let (program, args) = argv.split_first().context("empty command")?;
    let mut command = Command::new(program);
    command.args(args);
    command.envs(env.iter().map(|(name, value)| (name, value)));
    // SAFETY: the closure runs in the forked child before exec and only calls
    // ptrace(PTRACE_TRACEME), which is async-signal-safe.
    unsafe {
        command.pre_exec(|| ptrace::traceme().map_err(std::io::Error::from));
    }
    let child = command
        .spawn()
        .with_context(|| format!("cannot execute '{program}'"))?;
    let pid = Pid::from_raw(child.id() as i32);
    // The child owns no resources we need to release through `Child`; we reap it with waitpid.
    drop(child);

    match waitpid(pid, None).context("waiting for the target to exec")? {
        WaitStatus::Stopped(_, Signal::SIGTRAP) => {}
        other => bail!("'{program}' did not start: {other:?}"),
    }
    ptrace::setoptions(pid, ptrace::Options::PTRACE_O_EXITKILL)
        .context("setting ptrace options on the target")?;

    let entry =
        auxv_entry(pid).with_context(|| format!("reading the entry point of '{program}'"))?;
    let saved_word = ptrace::read(pid, entry as ptrace::AddressType)
        .with_context(|| format!("reading the entry point of '{program}' at {entry:#x}"))?;
    let with_int3 = (saved_word & !0xff) | 0xcc;
    // The address is the stopped tracee's entry point; ptrace writes go to the
    // tracee's memory, not ours.
    ptrace::write(pid, entry as ptrace::AddressType, with_int3)
        .context("planting a breakpoint at the entry point")?;
    ptrace::cont(pid, None).context("continuing the target to its entry point")?;

    loop {
        match waitpid(pid, None).context("waiting for the target's entry point")? {
            WaitStatus::Stopped(_, Signal::SIGTRAP) => break,
            WaitStatus::Stopped(_, signal) => {
                ptrace::cont(pid, Some(signal)).context("passing a signal to the target")?
            }
            WaitStatus::Exited(_, code) => {
                bail!("'{program}' exited with code {code} before reaching its entry point")
            }
            WaitStatus::Signaled(_, signal, _) => {
                bail!("'{program}' was killed by {signal} before reaching its entry point")
            }
            _ => {}
        }
    }
    Ok(Stopped {
        pid,
        entry,
        saved_word,
    })
}

impl Stopped {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// The entry point, where the target is held (by a breakpoint cargo-trace planted).
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// Undo the breakpoint, rewind to the entry point and let the target run untraced.
    pub fn resume(self) -> Result<Running> {
        ptrace::write(self.pid, self.entry as ptrace::AddressType, self.saved_word)
            .context("removing the entry breakpoint")?;
        let mut regs = ptrace::getregs(self.pid).context("reading the target's registers")?;
        regs.rip = self.entry;
        ptrace::setregs(self.pid, regs).context("rewinding the target to its entry point")?;
        ptrace::detach(self.pid, None).context("detaching from the target")?;
        Ok(Running { pid: self.pid })
    }
}

/// A started target running untraced; still our child, so we reap it.
pub struct Running {
    pid: Pid,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// How the target ended, or `None` while it runs.
    pub fn try_wait(&self) -> Result<Option<Exit>> {
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(Some(Exit::Code(code))),
                Ok(WaitStatus::Signaled(_, signal, _)) => {
                    return Ok(Some(Exit::Signal(signal as i32)))
                }
                Ok(_) => return Ok(None),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(error) => return Err(error).context("waiting for the target"),
            }
        }
    }
}

/// `AT_ENTRY` from /proc/PID/auxv.
fn auxv_entry(pid: Pid) -> Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv"))?;
    auxv.chunks_exact(16)
        .map(|pair| {
            let key = u64::from_ne_bytes(pair[..8].try_into().expect("8 bytes"));
            let value = u64::from_ne_bytes(pair[8..].try_into().expect("8 bytes"));
            (key, value)
        })
        .find(|&(key, _)| key == libc::AT_ENTRY)
        .map(|(_, value)| value)
        .context("no AT_ENTRY in the auxiliary vector")
}
