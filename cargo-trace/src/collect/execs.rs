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
    /// Dynamically linked (it has an interpreter: ld.so loads preloaded libraries).
    pub dynamic: bool,
}

/// What the reader keeps.
#[derive(Default)]
struct Tree {
    /// The target and its descendants (processes, by tgid).
    members: HashSet<u32>,
    /// Each exec of a member, in order.
    execs: Vec<Exec>,
}

/// The reader of process events, until it is dropped.
pub struct ExecWatch {
    tree: Arc<Mutex<Tree>>,
    socket: Arc<OwnedFd>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ExecWatch {
    /// Subscribes to the machine's process events; `None` where the kernel refuses
    /// (no CAP_NET_ADMIN, no process connector).
    pub fn start() -> Option<ExecWatch> {
        let socket = Arc::new(subscribe().ok()?);
        let tree = Arc::new(Mutex::new(Tree::default()));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (socket, tree, done) = (Arc::clone(&socket), Arc::clone(&tree), Arc::clone(&done));
            std::thread::Builder::new()
                .name("exec-watch".into())
                .spawn(move || read_events(&socket, &tree, &done))
                .ok()?
        };
        Some(ExecWatch {
            tree,
            socket,
            done,
            thread: Some(thread),
        })
    }

    /// Follows `pid` (the target) and what it starts from now on.
    pub fn follow(&self, pid: u32) {
        lock(&self.tree).members.insert(pid);
    }

    /// The execs of the target's tree so far.
    pub fn execs(&self) -> Vec<Exec> {
        lock(&self.tree).execs.clone()
    }
}

impl Drop for ExecWatch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        // Wakes the reader up: its receive times out within a tenth of a second.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = &self.socket;
    }
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
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
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

/// Reads events until `done`, keeping the forks and execs of the tree's members.
fn read_events(socket: &OwnedFd, tree: &Mutex<Tree>, done: &AtomicBool) {
    let mut buffer = [0u8; 4096];
    // Forks seen before their parent is known to be a member (the target's pid is told
    // after the launch, whose events may be read later): child -> parent.
    let mut parents: HashMap<u32, u32> = HashMap::new();
    while !done.load(Ordering::Acquire) {
        // SAFETY: recv into a buffer of its length on a descriptor we own.
        let n = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if n <= 0 {
            continue;
        }
        let mut offset = 0usize;
        let n = n as usize;
        while offset + NLMSG_HEADER <= n {
            let length = u32_at(&buffer, offset) as usize;
            if length < NLMSG_HEADER || offset + length > n {
                break;
            }
            let event = offset + NLMSG_HEADER + CN_MSG_HEADER;
            if event + 32 <= offset + length {
                handle(&buffer[event..offset + length], tree, &mut parents);
            }
            offset += (length + 3) & !3;
        }
    }
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    bytes
        .get(offset..offset + 4)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// One `struct proc_event`: what (u32), cpu (u32), timestamp (u64), then its union.
fn handle(event: &[u8], tree: &Mutex<Tree>, parents: &mut HashMap<u32, u32>) {
    let what = u32_at(event, 0);
    let data = 16;
    match what {
        PROC_EVENT_FORK => {
            let parent = u32_at(event, data + 4);
            let (child, child_tgid) = (u32_at(event, data + 8), u32_at(event, data + 12));
            if child != child_tgid {
                return; // a thread
            }
            let mut kept = lock(tree);
            if kept.members.contains(&parent) {
                kept.members.insert(child);
            } else {
                parents.insert(child, parent);
            }
        }
        PROC_EVENT_EXEC => {
            let pid = u32_at(event, data + 4);
            {
                let mut kept = lock(tree);
                // A fork read before its parent joined: the chain up to a member.
                let mut ancestor = Some(pid);
                let mut member = false;
                while let Some(up) = ancestor {
                    if kept.members.contains(&up) {
                        member = true;
                        break;
                    }
                    ancestor = parents.get(&up).copied();
                }
                if !member {
                    return;
                }
                kept.members.insert(pid);
            }
            // Read at once, the process still there, without the tree's lock.
            let exec = Exec {
                pid,
                command: command_line(pid),
                dynamic: has_interpreter(pid),
            };
            lock(tree).execs.push(exec);
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
/// loads preloaded libraries. Its program headers only are read.
fn has_interpreter(pid: u32) -> bool {
    use std::io::Read;
    const PT_INTERP: u32 = 3;
    let mut head = vec![0u8; 4096];
    let Ok(read) =
        std::fs::File::open(format!("/proc/{pid}/exe")).and_then(|mut file| file.read(&mut head))
    else {
        return false;
    };
    let head = &head[..read];
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([head[at], head[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or_default()) as usize;
    let (size, count) = (u16_at(54), u16_at(56));
    (0..count)
        .map(|i| phoff + i * size)
        .take_while(|&at| at + 4 <= head.len())
        .any(|at| u32_at(head, at) == PT_INTERP)
}
