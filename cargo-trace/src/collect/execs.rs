//! The images the target and its descendants exec, as the kernel's process connector
//! tells them (netlink, `CN_IDX_PROC`: every fork, exec and exit on the machine, as they
//! happen): which process ran which command, so that one that ran without the preloaded
//! library (its environment dropped `LD_PRELOAD`, or it is setuid) can be named.
//!
//! A thread of its own reads the events as they come (a command line is read from
//! `/proc` at once: a short child is gone soon) and keeps those of the target's tree.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// `NETLINK_CONNECTOR`, `CN_IDX_PROC`, `CN_VAL_PROC`, `PROC_CN_MCAST_LISTEN`.
const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x1;
const PROC_EVENT_EXEC: u32 = 0x2;
/// `struct nlmsghdr` and `struct cn_msg` before a `struct proc_event`.
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;

/// An image a traced process exec'd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub pid: u32,
    /// Its command line, as far as it could be read.
    pub command: String,
    /// Dynamically linked (it has an interpreter: ld.so loads preloaded libraries);
    /// `None` where it was gone before its executable could be read.
    pub dynamic: Option<bool>,
}

/// What the reader keeps.
#[derive(Default)]
struct Tree {
    /// The target and its descendants (processes, by tgid).
    members: HashSet<u32>,
    /// Each exec of a member, in order.
    execs: Vec<Exec>,
    /// Forks read before their parent was known to be a member (the target's pid is told
    /// after the launch, whose events may be read later): child -> parent.
    parents: HashMap<u32, u32>,
}

/// The socket and what has been read from it: whoever holds the lock reads what is
/// queued, so that the events are handled one at a time and in order.
struct Reader {
    socket: OwnedFd,
    tree: Mutex<Tree>,
}

/// The reader of process events, until it is dropped.
pub struct ExecWatch {
    reader: Arc<Reader>,
    done: Arc<AtomicBool>,
    /// Written at the end: wakes the reader from its wait at once.
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl ExecWatch {
    /// Subscribes to the machine's process events; `None` where the kernel refuses
    /// (no CAP_NET_ADMIN, no process connector).
    pub fn start() -> Option<ExecWatch> {
        let reader = Arc::new(Reader {
            socket: subscribe().ok()?,
            tree: Mutex::new(Tree::default()),
        });
        let done = Arc::new(AtomicBool::new(false));
        // SAFETY: eventfd(2) makes a descriptor this function owns from here.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return None;
        }
        // SAFETY: just made, owned by nothing else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(wake) });
        let thread = {
            let (reader, done, woken) = (Arc::clone(&reader), Arc::clone(&done), Arc::clone(&wake));
            std::thread::Builder::new()
                .name("exec-watch".into())
                .spawn(move || {
                    run_first();
                    while !done.load(Ordering::Acquire) {
                        if readable(&reader.socket, &woken) {
                            reader.read_queued();
                        }
                    }
                })
                .ok()?
        };
        Some(ExecWatch {
            reader,
            done,
            wake,
            thread: Some(thread),
        })
    }

    /// Follows `pid` (the target) and what it starts from now on.
    pub fn follow(&self, pid: u32) {
        lock(&self.reader.tree).members.insert(pid);
    }

    /// The execs of the target's tree so far, the events queued read first.
    pub fn execs(&self) -> Vec<Exec> {
        self.reader.read_queued();
        lock(&self.reader.tree).execs.clone()
    }
}

impl Drop for ExecWatch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to our eventfd: the reader's wait ends at once.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Reader {
    /// Handles every event queued on the socket, under the tree's lock.
    fn read_queued(&self) {
        let mut tree = lock(&self.tree);
        let mut buffer = [0u8; 4096];
        loop {
            // SAFETY: recv into a buffer of its length on a descriptor we own.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing queued (EAGAIN), or ENOBUFS: events lost while the machine forked
            // faster than they were read; those that follow are still read.
            if n <= 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                    continue;
                }
                return;
            }
            let n = n as usize;
            let mut offset = 0usize;
            while offset + NLMSG_HEADER <= n {
                let length = u32_at(&buffer, offset) as usize;
                if length < NLMSG_HEADER || offset + length > n {
                    break;
                }
                let event = offset + NLMSG_HEADER + CN_MSG_HEADER;
                if event + 32 <= offset + length {
                    handle(&buffer[event..offset + length], &mut tree);
                }
                offset += (length + 3) & !3;
            }
        }
    }
}

/// Waits until `socket` has something to read (true) or `wake` is written (false).
fn readable(socket: &OwnedFd, wake: &OwnedFd) -> bool {
    let mut polls = [socket, wake].map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two pollfds, ours.
    let ready = unsafe { libc::poll(polls.as_mut_ptr(), 2, -1) };
    ready > 0 && polls[0].revents & libc::POLLIN != 0
}

/// The reader runs ahead of the processes it reads about where it may (a real-time
/// thread, as root): a short child's command line and executable are read from `/proc`
/// as it execs, before it exits. Best effort; it only wakes on forks and execs.
fn run_first() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sets this thread's own policy.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
}

fn lock(tree: &Mutex<Tree>) -> std::sync::MutexGuard<'_, Tree> {
    tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A netlink socket bound to the process connector's group, listening.
fn subscribe() -> std::io::Result<OwnedFd> {
    // SAFETY: plain system calls on a descriptor this function owns; the structures are
    // built byte by byte in buffers of their size.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let socket = OwnedFd::from_raw_fd(fd);
        let mut address: libc::sockaddr_nl = std::mem::zeroed();
        address.nl_family = libc::AF_NETLINK as u16;
        address.nl_groups = CN_IDX_PROC;
        address.nl_pid = 0;
        if libc::bind(
            fd,
            (&address as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let mut message = [0u8; NLMSG_HEADER + CN_MSG_HEADER + 4];
        let total = message.len() as u32;
        message[0..4].copy_from_slice(&total.to_ne_bytes());
        message[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        message[12..16].copy_from_slice(&std::process::id().to_ne_bytes());
        let cn = NLMSG_HEADER;
        message[cn..cn + 4].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
        message[cn + 4..cn + 8].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
        message[cn + 16..cn + 18].copy_from_slice(&4u16.to_ne_bytes());
        message[cn + CN_MSG_HEADER..].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        if libc::send(fd, message.as_ptr().cast(), message.len(), 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(socket)
    }
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    bytes
        .get(offset..offset + 4)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// One `struct proc_event`: what (u32), cpu (u32), timestamp (u64), then its union.
fn handle(event: &[u8], kept: &mut Tree) {
    let what = u32_at(event, 0);
    let data = 16;
    match what {
        PROC_EVENT_FORK => {
            let parent = u32_at(event, data + 4);
            let (child, child_tgid) = (u32_at(event, data + 8), u32_at(event, data + 12));
            if child != child_tgid {
                return; // a thread
            }
            if kept.members.contains(&parent) {
                kept.members.insert(child);
            } else {
                kept.parents.insert(child, parent);
            }
        }
        PROC_EVENT_EXEC => {
            let pid = u32_at(event, data + 4);
            // A fork read before its parent joined: the chain up to a member.
            let mut ancestor = Some(pid);
            let mut member = false;
            while let Some(up) = ancestor {
                if kept.members.contains(&up) {
                    member = true;
                    break;
                }
                ancestor = kept.parents.get(&up).copied();
            }
            if !member {
                return;
            }
            kept.members.insert(pid);
            // Read at once, the process still there.
            kept.execs.push(Exec {
                pid,
                command: command_line(pid),
                dynamic: has_interpreter(pid),
            });
        }
        _ => {}
    }
}

/// `/proc/PID/cmdline` as one line.
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Whether the process's executable (a 64-bit ELF) has an interpreter: ld.so, which
/// loads preloaded libraries. Its program headers only are read; `None` where the
/// process is gone.
fn has_interpreter(pid: u32) -> Option<bool> {
    use std::io::Read;
    const PT_INTERP: u32 = 3;
    let mut head = vec![0u8; 4096];
    let read = std::fs::File::open(format!("/proc/{pid}/exe"))
        .and_then(|mut file| file.read(&mut head))
        .ok()?;
    let head = &head[..read];
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return Some(false);
    }
    let u16_at = |at: usize| u16::from_le_bytes([head[at], head[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or_default()) as usize;
    let (size, count) = (u16_at(54), u16_at(56));
    Some(
        (0..count)
            .map(|i| phoff + i * size)
            .take_while(|&at| at + 4 <= head.len())
            .any(|at| u32_at(head, at) == PT_INTERP),
    )
}
