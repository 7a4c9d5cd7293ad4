//! cargo-trace's end of the socket: a private directory with the library and the socket,
//! the target's environment, and the messages (hello, mappings, lookups).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unwind_tables::CompactTable;

use crate::layout::{self, bytes_of, bytes_of_slice, from_bytes, msg, Mapping, MsgHello};
use crate::recorder::{Recorder, RegionError};
use crate::sys;
use crate::tables::{encode_table, HookTarget, SourceMapping, TableError, TableSource};

/// Why the server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "{path} is not a directory only {owner} can change ({why}): the preloaded library \
         must not be loadable from a path another user can change"
    )]
    NotPrivate {
        path: PathBuf,
        owner: &'static str,
        why: String,
    },
    #[error(
        "no private directory for the heap profiler's socket: not root, and XDG_RUNTIME_DIR \
         is not set"
    )]
    NoRuntimeDir,
    #[error("the heap profiler's socket: {0}")]
    Socket(io::Error),
    #[error("the unwind tables' shared memory: {0}")]
    Tables(io::Error),
    #[error(transparent)]
    Source(#[from] TableError),
    #[error(transparent)]
    Region(#[from] RegionError),
}

/// One process image's connection.
struct Connection {
    fd: OwnedFd,
    pid: u32,
    /// Its region's index in the recorder, once it said hello.
    region: Option<usize>,
    /// The functions last listed for it to hook.
    hook_targets: Vec<HookTarget>,
}

/// What became of an allocator function a process's library was told to hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookOutcome {
    /// Hooked: its calls are counted.
    Hooked,
    /// cargo-trace would not hook it, for this reason: its calls are not counted.
    Refused(String),
    /// The library could not write it (no room within reach, the code not writable):
    /// its calls are not counted.
    NotPlaced,
}

/// One allocator function of one process, and what became of its hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookReport {
    pub pid: u32,
    pub entry: u64,
    pub name: String,
    pub object: PathBuf,
    pub outcome: HookOutcome,
}

/// The largest message a library sends (a hook plan of [`layout::MAX_HOOKS`] functions).
const MESSAGE_BYTES: usize = 16 << 10;

/// The socket, the library file, the tables memfd and the connections.
pub struct Server {
    library: PathBuf,
    socket: PathBuf,
    listener: OwnedFd,
    tables: std::fs::File,
    /// The same memfd opened read-only: what the library gets.
    tables_read_only: OwnedFd,
    tables_len: u64,
    /// Each table written, by the address of its shared copy (kept alive here, so the
    /// address is never another table's).
    written: HashMap<usize, (Arc<CompactTable>, u64)>,
    connections: Vec<Connection>,
    /// Every hook planned, in the order told.
    hooks: Vec<HookReport>,
    /// Last: removed once the rest is closed.
    _dir: PrivateDir,
}

/// Removes the directories of sessions whose process is gone (killed before its
/// `Drop` ran): each is named after the pid that made it.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix("heap-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The session's directory, removed with what it holds when the server goes.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ROOT_BASE: &str = "/run/cargo-trace";

/// Checks that `path` is a directory that only `uid` (and root) can change, without
/// following a symbolic link.
fn check_private(path: &Path, uid: u32, owner: &'static str) -> Result<(), Error> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| Error::Io {
        what: "inspecting",
        path: path.to_path_buf(),
        source,
    })?;
    let why = if !meta.file_type().is_dir() {
        Some("not a directory".to_string())
    } else if meta.uid() != uid && meta.uid() != 0 {
        Some(format!("owned by uid {}", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!("mode {:o}", meta.mode() & 0o7777))
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::NotPrivate {
            path: path.to_path_buf(),
            owner,
            why,
        }),
        None => Ok(()),
    }
}

/// Where the session's directory goes: `/run/cargo-trace` for root (made 0755 if
/// missing), `$XDG_RUNTIME_DIR` otherwise; every ancestor checked.
fn private_base() -> Result<PathBuf, Error> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let (base, owner) = if uid == 0 {
        let base = PathBuf::from(ROOT_BASE);
        match std::fs::DirBuilder::new().mode(0o755).create(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "making",
                    path: base,
                    source,
                })
            }
        }
        (base, "root")
    } else {
        let dir = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or(Error::NoRuntimeDir)?;
        (dir, "you")
    };
    let mut ancestor = Some(base.as_path());
    while let Some(dir) = ancestor {
        check_private(dir, uid, owner)?;
        ancestor = dir.parent();
    }
    Ok(base)
}

impl Server {
    /// Makes a new private directory with the library and the listening socket, and an
    /// empty tables memfd.
    pub fn new() -> Result<Server, Error> {
        let base = private_base()?;
        remove_stale(&base);
        let dir = loop {
            let name = sys::random_name().map_err(Error::Socket)?;
            let dir = base.join(format!("heap-{}-{name}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => break PrivateDir(dir),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(Error::Io {
                        what: "making",
                        path: dir,
                        source,
                    })
                }
            }
        };
        let io_error = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { what, path, source }
        };
        // 0755 whatever the umask: the target may run as another user
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755))
            .map_err(io_error("setting the mode of", &dir.0))?;
        let library = dir.0.join(crate::FILE_NAME);
        // created here, exclusively, in a directory no one else can change
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&library)
            .map_err(io_error("writing", &library))?;
        io::Write::write_all(&mut file, crate::LIBRARY).map_err(io_error("writing", &library))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io_error("setting the mode of", &library))?;
        let socket = dir.0.join("socket");
        let listener = sys::listen_seqpacket(&socket).map_err(Error::Socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .map_err(io_error("setting the mode of", &socket))?;
        let tables = sys::memfd(c"cargo-trace-tables", 0).map_err(Error::Tables)?;
        let tables_read_only = sys::reopen_read_only(&tables).map_err(Error::Tables)?;
        Ok(Server {
            library,
            socket,
            listener,
            tables: std::fs::File::from(tables),
            tables_read_only,
            tables_len: 0,
            written: HashMap::new(),
            connections: Vec::new(),
            hooks: Vec::new(),
            _dir: dir,
        })
    }

    /// The library's path, in the private directory.
    pub fn library_path(&self) -> &Path {
        &self.library
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// `LD_PRELOAD` for the target: the library first, then what the variable held.
    pub fn ld_preload(&self, existing: Option<OsString>) -> OsString {
        let mut value = self.library.as_os_str().to_os_string();
        if let Some(existing) = existing.filter(|e| !e.is_empty()) {
            value.push(":");
            value.push(existing);
        }
        value
    }

    /// The target's environment for in-process recording: `LD_PRELOAD` and the socket.
    pub fn environment(
        &self,
        existing_ld_preload: Option<OsString>,
    ) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.ld_preload(existing_ld_preload)),
            (
                crate::SOCKET_VARIABLE,
                self.socket.as_os_str().to_os_string(),
            ),
        ]
    }

    /// The hooks of every process so far: each allocator function found, and what
    /// became of it.
    pub fn hooks(&self) -> &[HookReport] {
        &self.hooks
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.connections.len()
    }

    /// Handles what is pending (new connections, hellos, lookups, closed connections),
    /// waiting up to `timeout` for the first of them; then returns. Call it from the
    /// session's wait loop (or a thread) often: a thread that asks for a mapping waits
    /// for the answer.
    pub fn serve(
        &mut self,
        source: &mut dyn TableSource,
        recorder: &mut Recorder,
        timeout: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut wait = timeout;
        loop {
            let mut fds = vec![self.listener.as_raw_fd()];
            fds.extend(self.connections.iter().map(|c| c.fd.as_raw_fd()));
            let ms = wait.as_millis().min(i32::MAX as u128) as i32;
            let ready = sys::poll_readable(&fds, ms).map_err(Error::Socket)?;
            if !ready.iter().any(|&r| r) {
                return Ok(());
            }
            if ready[0] {
                while let Some(fd) = sys::accept(&self.listener).map_err(Error::Socket)? {
                    let pid = sys::peer_pid(fd.as_raw_fd()).unwrap_or(0);
                    self.connections.push(Connection {
                        fd,
                        pid,
                        region: None,
                        hook_targets: Vec::new(),
                    });
                }
            }
            let mut closed = Vec::new();
            for (index, &is_ready) in ready.iter().enumerate().skip(1) {
                if is_ready && !self.handle(index - 1, source, recorder)? {
                    closed.push(index - 1);
                }
            }
            for &index in closed.iter().rev() {
                let connection = self.connections.remove(index);
                if let Some(region) = connection.region {
                    recorder.close(region);
                }
            }
            // whatever else is pending now, without waiting
            wait = Duration::ZERO;
            if Instant::now() >= deadline && closed.is_empty() && !ready[0] {
                return Ok(());
            }
        }
    }

    /// Handles one message of connection `index`; false when the connection is gone.
    fn handle(
        &mut self,
        index: usize,
        source: &mut dyn TableSource,
        recorder: &mut Recorder,
    ) -> Result<bool, Error> {
        let mut buf = vec![0u8; MESSAGE_BYTES];
        let raw = self.connections[index].fd.as_raw_fd();
        let (len, fd) = match sys::receive(raw, &mut buf, true) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(_) => return Ok(false),
        };
        if len == 0 {
            return Ok(false);
        }
        let kind = from_bytes::<u32>(&buf[..len]).unwrap_or(0);
        let pid = self.connections[index].pid;
        match kind {
            msg::HELLO if self.connections[index].region.is_none() => {
                let Some(hello) = from_bytes::<MsgHello>(&buf[..len]) else {
                    return Ok(false);
                };
                let Some(fd) = fd else { return Ok(false) };
                if hello.magic != layout::MAGIC || hello.version != layout::VERSION {
                    return Ok(false);
                }
                let image = hello.flags & layout::HELLO_FORKED == 0;
                let region = match recorder.add_region(pid, &fd, image) {
                    Ok(region) => region,
                    Err(_) => return Ok(false),
                };
                self.connections[index].region = Some(region);
                self.send_mappings(index, source, recorder, true)?;
                Ok(true)
            }
            msg::LOOKUP if self.connections[index].region.is_some() => {
                self.send_mappings(index, source, recorder, false)?;
                Ok(true)
            }
            msg::HOOKS if self.connections[index].region.is_some() => {
                self.send_hook_targets(index, source);
                Ok(true)
            }
            msg::HOOK_PLAN if self.connections[index].region.is_some() => {
                self.send_hook_code(index, source, &buf[..len]);
                Ok(true)
            }
            msg::HOOK_PLACED => {
                self.hooks_placed(index, &buf[..len]);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Answers a library's question of the functions to hook in its process now.
    fn send_hook_targets(&mut self, index: usize, source: &mut dyn TableSource) {
        let connection = &mut self.connections[index];
        let mut targets = source.hook_targets(connection.pid);
        targets.truncate(layout::MAX_HOOKS);
        let head = layout::MsgHookList {
            kind: msg::HOOK_LIST,
            ntargets: targets.len() as u32,
        };
        let listed: Vec<layout::HookTarget> = targets
            .iter()
            .map(|t| layout::HookTarget {
                entry: t.entry,
                leaf: t.leaf,
                kind: t.kind.code(),
                pad: 0,
            })
            .collect();
        connection.hook_targets = targets;
        let mut message = bytes_of(&head).to_vec();
        message.extend_from_slice(bytes_of_slice(&listed));
        let _ = sys::send(connection.fd.as_raw_fd(), &message, None);
    }

    /// Answers a library's plan (where each hook's stub and trampoline go) with the bytes
    /// to write, or a refusal.
    fn send_hook_code(&mut self, index: usize, source: &mut dyn TableSource, message: &[u8]) {
        let head_bytes = std::mem::size_of::<layout::MsgHookPlan>();
        let where_bytes = std::mem::size_of::<layout::HookWhere>();
        let count = from_bytes::<layout::MsgHookPlan>(message).map_or(0, |h| h.nhooks as usize);
        let count = count
            .min(layout::MAX_HOOKS)
            .min(message.len().saturating_sub(head_bytes) / where_bytes);
        let connection = &self.connections[index];
        let mut codes = Vec::with_capacity(count);
        for i in 0..count {
            let Some(place) =
                from_bytes::<layout::HookWhere>(&message[head_bytes + i * where_bytes..])
            else {
                break;
            };
            let mut code = layout::HookCode {
                entry: place.entry,
                refused: 1,
                patch_len: 0,
                code_len: 0,
                patch: [0; layout::HOOK_PATCH],
                code: [0; layout::HOOK_ROOM],
            };
            let Some(target) = connection
                .hook_targets
                .iter()
                .find(|t| t.entry == place.entry)
            else {
                codes.push(code);
                continue;
            };
            let room = (place.room as usize).min(layout::HOOK_ROOM);
            let outcome = match source.plan_hook(
                connection.pid,
                target,
                place.stub,
                place.trampoline,
                room,
            ) {
                Ok(planned)
                    if planned.patch.len() <= layout::HOOK_PATCH && planned.code.len() <= room =>
                {
                    code.refused = 0;
                    code.patch_len = planned.patch.len() as u16;
                    code.code_len = planned.code.len() as u16;
                    code.patch[..planned.patch.len()].copy_from_slice(&planned.patch);
                    code.code[..planned.code.len()].copy_from_slice(&planned.code);
                    HookOutcome::Hooked
                }
                Ok(_) => HookOutcome::Refused("its trampoline is too long".to_string()),
                Err(why) => HookOutcome::Refused(why),
            };
            self.hooks.push(HookReport {
                pid: connection.pid,
                entry: target.entry,
                name: target.name.clone(),
                object: target.object.clone(),
                outcome,
            });
            codes.push(code);
        }
        let head = layout::MsgHookCode {
            kind: msg::HOOK_CODE,
            ncodes: codes.len() as u32,
        };
        let mut answer = bytes_of(&head).to_vec();
        answer.extend_from_slice(bytes_of_slice(&codes));
        let _ = sys::send(connection.fd.as_raw_fd(), &answer, None);
    }

    /// Takes a library's word of the hooks it could not write.
    fn hooks_placed(&mut self, index: usize, message: &[u8]) {
        let head_bytes = std::mem::size_of::<layout::MsgHookPlaced>();
        let Some(head) = from_bytes::<layout::MsgHookPlaced>(message) else {
            return;
        };
        let pid = self.connections[index].pid;
        let failed = (head.nfailed as usize).min(message.len().saturating_sub(head_bytes) / 8);
        for i in 0..failed {
            let Some(entry) = from_bytes::<u64>(&message[head_bytes + i * 8..]) else {
                break;
            };
            if let Some(report) = self
                .hooks
                .iter_mut()
                .rev()
                .find(|r| r.pid == pid && r.entry == entry)
            {
                report.outcome = HookOutcome::NotPlaced;
            }
        }
    }

    /// Sends the process's mappings (and, with the first, the tables' descriptor).
    fn send_mappings(
        &mut self,
        index: usize,
        source: &mut dyn TableSource,
        recorder: &Recorder,
        first: bool,
    ) -> Result<(), Error> {
        let pid = self.connections[index].pid;
        let mut mappings = source.mappings(pid).unwrap_or_default();
        if mappings.len() > layout::MAX_MAPPINGS {
            // anonymous code has no table anyway: it goes first
            mappings.retain(|m| m.table.is_some());
            mappings.truncate(layout::MAX_MAPPINGS);
        }
        let mut encoded = Vec::with_capacity(mappings.len());
        for m in &mappings {
            encoded.push(self.encode_mapping(m)?);
        }
        let head = layout::MsgMappings {
            kind: msg::MAPPINGS,
            nmappings: encoded.len() as u32,
            options: recorder.options().for_library(),
        };
        let mut message = bytes_of(&head).to_vec();
        message.extend_from_slice(bytes_of_slice(&encoded));
        let fd = first.then(|| self.tables_read_only.as_raw_fd());
        // a process that is gone cannot take it: its connection closes next
        let _ = sys::send(self.connections[index].fd.as_raw_fd(), &message, fd);
        Ok(())
    }

    fn encode_mapping(&mut self, m: &SourceMapping) -> Result<Mapping, Error> {
        let table = match &m.table {
            Some(table) => self.table_offset(table)?,
            None => layout::NO_TABLE,
        };
        Ok(Mapping {
            start: m.start,
            end: m.end,
            bias: m.bias,
            table,
            object: m
                .object
                .filter(|&id| id > 0 && id < layout::MAX_OBJECTS)
                .unwrap_or(0),
            flags: if m.table.is_none() {
                layout::MAPPING_NO_TABLE
            } else {
                0
            },
        })
    }

    /// Where `table` is in the tables memfd, appended the first time.
    fn table_offset(&mut self, table: &Arc<CompactTable>) -> Result<u64, Error> {
        let key = Arc::as_ptr(table) as usize;
        if let Some((_, offset)) = self.written.get(&key) {
            return Ok(*offset);
        }
        let bytes = encode_table(table);
        let offset = self.tables_len;
        self.tables
            .write_all_at(&bytes, offset)
            .map_err(Error::Tables)?;
        self.tables_len += bytes.len() as u64;
        self.written.insert(key, (table.clone(), offset));
        Ok(offset)
    }
}
