//! An on-disk cache of compiled objects, so a second run does not recompile.
//!
//! Entries are keyed by GNU build-id: the same build-id is the same code wherever the file
//! lives, so a library shared by many programs is compiled once. A file without a build-id
//! is keyed by its identity (device, inode, modification time in ns, size). Hashing its
//! contents instead would cost a read of the whole file on every hit (tens of ms for a large
//! binary, against a 2 ms budget for a hit), while the identity is one `fstat`; it can only
//! be fooled by a same-size rewrite in place within the same nanosecond timestamp, which
//! neither linkers nor package managers do (they write a new inode and rename).
//!
//! An entry is one file: a magic, a format version and the compiler version, the key, the
//! compiled object, and a checksum. Anything unexpected (another version, a different key,
//! truncation, a flipped bit, a table that breaks its invariants) makes the entry invalid,
//! and it is recompiled and replaced; reading an entry never panics. Entries are written to
//! a temporary file in the same directory and renamed into place, so readers see a whole
//! entry or none; concurrent writers of one key each rename a complete file. No fsync: after
//! a crash a torn entry fails its checksum and is recompiled, which is all a cache needs.
//!
//! An entry records what the compiler produced when it was written: a separate debug file
//! installed later does not refresh it (clear the directory to force that).
//!
//! The cache may be used by a privileged process on behalf of a user (root under sudo, in
//! the user's home), so nothing in it is trusted to be where its path says: the directory
//! is opened one component at a time without following symbolic links, every directory on
//! the way must belong to root or to the cache's [`Owner`] and be writable by nobody else
//! (a sticky directory such as `/tmp` excepted), directories are created only inside one
//! the owner owns, and the cache directory itself must be the owner's. Entries are read
//! without following links and only when they are regular files; new entries are created
//! exclusively under a random name in the opened directory, given to the owner, and renamed
//! into place (a link planted under an entry's name is replaced, never followed). Anything
//! else makes the cache unusable for the run, never a write elsewhere.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, mkdirat, Mode};

use crate::compile::{compile_mapped, map_file, CompiledObject};
use crate::elf::{self, hex, DebugSearch};
use crate::error::Error;
use crate::rule::{Cfa, RbpRule, Reg, Rule, RuleKind, UnsupportedReason};
use crate::stats::{KindCount, Stats};
use crate::table::{CompactRow, CompactTable, PageSpan};

const MAGIC: &[u8; 8] = b"CTUNWTBL";
/// Bump when the entry layout or what the compiler puts in it changes (2: push/pop rows
/// merged, `RspSteps` rules; 3: an entry point without CFI is End; 4: `ReturnInRdi`).
pub const FORMAT_VERSION: u32 = 5;
/// Entries written by another compiler version are recompiled: its rules may differ even
/// when the layout does not.
const COMPILER_VERSION: &str = env!("CARGO_PKG_VERSION");
const ENTRY_EXTENSION: &str = "ctu";

/// A directory of compiled objects.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
    search: DebugSearch,
    owner: Owner,
}

/// Who the cache directory and its entries belong to: what the cache creates is given to
/// them, and a directory on the way that belongs to anyone else but root is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// The process's effective user and group.
    pub fn current() -> Owner {
        Owner {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        }
    }
}

/// A compiled object and where it came from.
#[derive(Debug)]
pub struct Loaded {
    pub object: CompiledObject,
    pub outcome: Outcome,
}

/// How [`Cache::load_or_compile`] obtained the object.
#[derive(Debug)]
pub enum Outcome {
    /// Read from a valid entry.
    Hit,
    /// Compiled. `invalid_entry` says why an existing entry was not used; `store_error` why
    /// the result could not be written (the object is good either way: callers may warn).
    Compiled {
        invalid_entry: Option<InvalidEntry>,
        store_error: Option<io::Error>,
    },
}

/// Why a cache entry was not used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidEntry {
    #[error("cannot read the entry: {0}")]
    Unreadable(io::Error),
    #[error("not a cache entry (bad magic)")]
    BadMagic,
    #[error("entry format {found}, expected {FORMAT_VERSION}")]
    FormatVersion { found: u32 },
    #[error("entry written by compiler {found}, this is {COMPILER_VERSION}")]
    CompilerVersion { found: String },
    #[error("entry is for another object")]
    KeyMismatch,
    #[error("entry is corrupt: {0}")]
    Corrupt(&'static str),
}

/// What identifies the object an entry belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    BuildId(Vec<u8>),
    File {
        dev: u64,
        ino: u64,
        mtime_ns: i128,
        size: u64,
    },
}

impl Key {
    const BUILD_ID: u8 = 1;
    const FILE: u8 = 2;

    fn file_name(&self) -> String {
        match self {
            Key::BuildId(id) => format!("b-{}.{ENTRY_EXTENSION}", hex(id)),
            Key::File {
                dev,
                ino,
                mtime_ns,
                size,
            } => {
                format!("f-{dev:x}-{ino:x}-{mtime_ns:x}-{size:x}.{ENTRY_EXTENSION}")
            }
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Key::BuildId(id) => {
                out.push(Key::BUILD_ID);
                put_bytes(out, id);
            }
            Key::File {
                dev,
                ino,
                mtime_ns,
                size,
            } => {
                out.push(Key::FILE);
                let mut bytes = Vec::with_capacity(40);
                bytes.extend_from_slice(&dev.to_le_bytes());
                bytes.extend_from_slice(&ino.to_le_bytes());
                bytes.extend_from_slice(&mtime_ns.to_le_bytes());
                bytes.extend_from_slice(&size.to_le_bytes());
                put_bytes(out, &bytes);
            }
        }
    }
}

impl Cache {
    /// A cache in `dir` (an absolute path), created on first store, owned by the process's
    /// effective user.
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache {
            dir: dir.into(),
            search: DebugSearch::default(),
            owner: Owner::current(),
        }
    }

    /// The same cache, owned by `owner`: directories and entries it creates are given to
    /// them, and the cache directory must be theirs.
    pub fn with_owner(mut self, owner: Owner) -> Cache {
        self.owner = owner;
        self
    }

    /// The same cache, compiling with `search` for separate debug files.
    pub fn with_debug_search(mut self, search: DebugSearch) -> Cache {
        self.search = search;
        self
    }

    /// `$XDG_CACHE_HOME/cargo-trace/unwind`, or `~/.cache/cargo-trace/unwind`; `None` when
    /// neither variable gives an absolute path.
    pub fn default_dir() -> Option<PathBuf> {
        let absolute = |var: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .filter(|path| path.is_absolute())
        };
        let base = absolute("XDG_CACHE_HOME")
            .or_else(|| absolute("HOME").map(|home| home.join(".cache")))?;
        Some(base.join("cargo-trace").join("unwind"))
    }

    /// The directory entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compiled object of the ELF file at `path`, from the cache if a valid entry
    /// exists, else compiled (see [`crate::compile_file`]) and stored.
    pub fn load_or_compile(&self, path: impl AsRef<Path>) -> Result<Loaded, Error> {
        let path = path.as_ref();
        let io_error = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let map = map_file(path)?;
        let key = match elf::build_id(&map)? {
            Some(id) if !id.is_empty() => Key::BuildId(id.to_vec()),
            _ => {
                // Metadata of the path right after mapping it: the mapped inode unless the
                // path was replaced in between, in which case the entry is merely keyed to
                // the newer file and will miss next time.
                let meta = fs::metadata(path).map_err(io_error)?;
                Key::File {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    mtime_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                    size: meta.size(),
                }
            }
        };
        let name = key.file_name();

        let invalid_entry = match self.read_entry(&name) {
            Ok(None) => None,
            Ok(Some(bytes)) => match decode(&bytes, &key) {
                Ok(object) => {
                    return Ok(Loaded {
                        object,
                        outcome: Outcome::Hit,
                    })
                }
                Err(invalid) => Some(invalid),
            },
            Err(error) => Some(InvalidEntry::Unreadable(error)),
        };

        let object = compile_mapped(path, &map, &self.search)?;
        let store_error = self.store(&name, &encode(&key, &object)).err();
        Ok(Loaded {
            object,
            outcome: Outcome::Compiled {
                invalid_entry,
                store_error,
            },
        })
    }

    /// The bytes of entry `name`; `None` when there is no cache directory or no such entry.
    fn read_entry(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let dir = match self.open_dir(false) {
            Ok(dir) => dir,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        // Non-blocking: a FIFO planted under the name must not hang the open.
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = match openat(&dir, name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => return Err(refused(&self.dir.join(name), "a symbolic link")),
            Err(errno) => return Err(errno.into()),
        };
        if !file.metadata()?.is_file() {
            return Err(refused(&self.dir.join(name), "not a regular file"));
        }
        let mut bytes = Vec::new();
        (&file).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// Writes `bytes` to entry `name` atomically: a file created exclusively under a random
    /// name in the opened directory (so the rename stays on one filesystem, and nothing
    /// planted under a predictable name is followed), given to the owner, then renamed over
    /// the old entry.
    fn store(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let dir = self.open_dir(true)?;
        // The opened directory by its descriptor: whatever its path names by now.
        let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        let mut temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(&at)?;
        temp.write_all(bytes)?;
        if self.owner != Owner::current() {
            std::os::unix::fs::fchown(temp.as_file(), Some(self.owner.uid), Some(self.owner.gid))?;
        }
        temp.persist(at.join(name)).map_err(|error| error.error)?;
        Ok(())
    }

    /// Opens the cache directory one component at a time, following no link; checks every
    /// directory on the way (see the module's docs) and, with `create`, creates the missing
    /// ones for the owner.
    fn open_dir(&self, create: bool) -> io::Result<OwnedFd> {
        let mut components = self.dir.components();
        if components.next() != Some(Component::RootDir) {
            return Err(refused(&self.dir, "not an absolute path"));
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir: OwnedFd = nix::fcntl::open("/", flags, Mode::empty())?;
        let mut path = PathBuf::from("/");
        let mut owned_by_owner = self.check_dir(&dir, &path)?;
        for component in components {
            let Component::Normal(name) = component else {
                return Err(refused(&self.dir, "not a normalized path"));
            };
            path.push(name);
            let opened = match openat(&dir, name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
                Err(Errno::ENOENT) if create => {
                    if !owned_by_owner {
                        return Err(refused(
                            &path,
                            "missing, in a directory that is not the cache owner's",
                        ));
                    }
                    match mkdirat(&dir, name, Mode::S_IRWXU) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(errno) => return Err(errno.into()),
                    }
                    let created = openat(&dir, name, flags | OFlag::O_NOFOLLOW, Mode::empty());
                    if let Ok(created) = &created {
                        if self.owner != Owner::current()
                            && fstat(created)?.st_uid != self.owner.uid
                        {
                            std::os::unix::fs::fchown(
                                created,
                                Some(self.owner.uid),
                                Some(self.owner.gid),
                            )?;
                        }
                    }
                    created
                }
                other => other,
            };
            dir = match opened {
                Ok(opened) => opened,
                // O_NOFOLLOW on a link: ELOOP; a link or file where a directory should be
                // with O_DIRECTORY: ENOTDIR.
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    return Err(refused(&path, "a symbolic link or not a directory"))
                }
                Err(errno) => return Err(errno.into()),
            };
            owned_by_owner = self.check_dir(&dir, &path)?;
        }
        if !owned_by_owner {
            return Err(refused(&self.dir, "not owned by the cache's owner"));
        }
        Ok(dir)
    }

    /// Refuses a directory another user could change; `Ok(true)` when the owner owns it.
    fn check_dir(&self, dir: &OwnedFd, path: &Path) -> io::Result<bool> {
        let stat = fstat(dir)?;
        if stat.st_uid != 0 && stat.st_uid != self.owner.uid {
            return Err(refused(path, "owned by another user"));
        }
        let writable_by_others = stat.st_mode & 0o022 != 0;
        let sticky = stat.st_mode & 0o1000 != 0;
        if writable_by_others && !sticky {
            return Err(refused(path, "writable by other users"));
        }
        Ok(stat.st_uid == self.owner.uid)
    }
}

/// Why a cache path is not used.
fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("unsafe cache path {}: {why}", path.display()),
    )
}

// ---- encoding --------------------------------------------------------------------------

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

/// FNV-1a over 8-byte words in four independent lanes, combined at the end: detects torn
/// writes and bit rot (not tampering; the cache directory belongs to the user). Lanes keep
/// the multiplications from forming one serial chain, so a multi-megabyte entry checks in
/// well under a millisecond.
fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut lanes = [0xcbf2_9ce4_8422_2325u64; 4];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut array = [0u8; 8];
            array.copy_from_slice(word);
            *lane = (*lane ^ u64::from_le_bytes(array)).wrapping_mul(PRIME);
        }
    }
    let mut hash = bytes.len() as u64;
    for lane in lanes {
        hash = (hash ^ lane).wrapping_mul(PRIME);
    }
    for &byte in blocks.remainder() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
    }
    hash
}

// Rule encoding: kind, register, rbp kind, reason, then three i32 operands (for RspSteps the
// third holds the pushes in its low 16 bits, the pops in its high 16). The same shape as the
// BPF `ct_rule`, but owned by this file: the cache format changes only with FORMAT_VERSION.
const KIND_GAP: u8 = 0;
const KIND_CFA_RSP: u8 = 1;
const KIND_CFA_RBP: u8 = 2;
const KIND_PLT: u8 = 3;
const KIND_DEREF: u8 = 4;
const KIND_END: u8 = 5;
const KIND_SIGNAL: u8 = 6;
const KIND_UNSUPPORTED: u8 = 7;
const KIND_CFA_RSP_STEPS: u8 = 8;
const KIND_RETURN_IN_RDI: u8 = 9;

fn encode_rule(out: &mut Vec<u8>, rule: Rule) {
    let (kind, reg, rbp, reason, cfa_offset, add) = match rule {
        Rule::Gap => (KIND_GAP, 0, RbpRule::Same, 0, 0, 0),
        Rule::End => (KIND_END, 0, RbpRule::Same, 0, 0, 0),
        Rule::Signal => (KIND_SIGNAL, 0, RbpRule::Same, 0, 0, 0),
        Rule::ReturnInRdi(offset) => (KIND_RETURN_IN_RDI, 0, RbpRule::Same, 0, offset, 0),
        Rule::Unsupported(reason) => (KIND_UNSUPPORTED, 0, RbpRule::Same, reason as u8, 0, 0),
        Rule::Frame { cfa, rbp } => match cfa {
            Cfa::Rsp(offset) => (KIND_CFA_RSP, 0, rbp, 0, offset, 0),
            Cfa::RspSteps {
                offset,
                pushes,
                pops,
            } => {
                let steps = u32::from(pushes) | u32::from(pops) << 16;
                (KIND_CFA_RSP_STEPS, 0, rbp, 0, offset, steps as i32)
            }
            Cfa::Rbp(offset) => (KIND_CFA_RBP, 0, rbp, 0, offset, 0),
            Cfa::Plt { threshold } => (KIND_PLT, 0, rbp, 0, i32::from(threshold), 0),
            Cfa::Deref { reg, offset, add } => (KIND_DEREF, reg as u8, rbp, 0, offset, add),
        },
    };
    let (rbp_kind, rbp_offset) = match rbp {
        RbpRule::Same => (0u8, 0),
        RbpRule::AtCfa(offset) => (1, offset),
        RbpRule::AtRbp(offset) => (2, offset),
    };
    out.extend_from_slice(&[kind, reg, rbp_kind, reason]);
    out.extend_from_slice(&cfa_offset.to_le_bytes());
    out.extend_from_slice(&rbp_offset.to_le_bytes());
    out.extend_from_slice(&add.to_le_bytes());
}

fn kind_code(kind: RuleKind) -> (u8, u8) {
    match kind {
        RuleKind::Gap => (KIND_GAP, 0),
        RuleKind::CfaRsp => (KIND_CFA_RSP, 0),
        RuleKind::CfaRspSteps => (KIND_CFA_RSP_STEPS, 0),
        RuleKind::CfaRbp => (KIND_CFA_RBP, 0),
        RuleKind::Plt => (KIND_PLT, 0),
        RuleKind::Deref => (KIND_DEREF, 0),
        RuleKind::End => (KIND_END, 0),
        RuleKind::Signal => (KIND_SIGNAL, 0),
        RuleKind::ReturnInRdi => (KIND_RETURN_IN_RDI, 0),
        RuleKind::Unsupported(reason) => (KIND_UNSUPPORTED, reason as u8),
    }
}

fn stats_counters(stats: &Stats) -> [u64; 13] {
    [
        stats.eh_frame_fdes,
        stats.debug_frame_fdes,
        stats.unparsable_fdes,
        stats.outside_code_fdes,
        stats.shadowed_fdes,
        u64::from(stats.separate_debug_file),
        stats.cfi_rows,
        stats.rows,
        stats.rules,
        stats.pages,
        stats.kernel_bytes,
        stats.code_bytes_with_cfi,
        stats.code_bytes_supported,
    ]
}

fn encode(key: &Key, object: &CompiledObject) -> Vec<u8> {
    let table = &object.table;
    let mut out = Vec::with_capacity(
        128 + table.pages.len() * 8 + table.rows.len() * 4 + table.rules.len() * 16,
    );
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, FORMAT_VERSION);
    put_bytes(&mut out, COMPILER_VERSION.as_bytes());
    key.encode(&mut out);
    match &object.build_id {
        Some(id) => {
            out.push(1);
            put_bytes(&mut out, id);
        }
        None => out.push(0),
    }
    put_u64(&mut out, table.first_page);
    put_u32(&mut out, table.pages.len() as u32);
    for page in &table.pages {
        put_u32(&mut out, page.first_row);
        put_u32(&mut out, page.nrows);
    }
    put_u32(&mut out, table.rows.len() as u32);
    for row in &table.rows {
        out.extend_from_slice(&row.addr_lo.to_le_bytes());
        out.extend_from_slice(&row.rule.to_le_bytes());
    }
    put_u32(&mut out, table.rules.len() as u32);
    for &rule in &table.rules {
        encode_rule(&mut out, rule);
    }
    for counter in stats_counters(&object.stats) {
        put_u64(&mut out, counter);
    }
    put_u32(&mut out, object.stats.kinds.len() as u32);
    for count in &object.stats.kinds {
        let (kind, reason) = kind_code(count.kind);
        out.extend_from_slice(&[kind, reason]);
        put_u64(&mut out, count.rows);
        put_u64(&mut out, count.bytes);
    }
    let sum = checksum(&out);
    put_u64(&mut out, sum);
    out
}

// ---- decoding --------------------------------------------------------------------------

/// Reads little-endian values, failing (never panicking) past the end.
struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], InvalidEntry> {
        if len > self.bytes.len() {
            return Err(InvalidEntry::Corrupt("truncated"));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], InvalidEntry> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, InvalidEntry> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, InvalidEntry> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, InvalidEntry> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, InvalidEntry> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], InvalidEntry> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// A count of items of `item_size` bytes each, checked against what is left before
    /// anything is allocated for them.
    fn count(&mut self, item_size: usize) -> Result<usize, InvalidEntry> {
        let count = self.u32()? as usize;
        if count.saturating_mul(item_size) > self.bytes.len() {
            return Err(InvalidEntry::Corrupt("count larger than the entry"));
        }
        Ok(count)
    }
}

fn decode_rule(input: &mut Input<'_>) -> Result<Rule, InvalidEntry> {
    let [kind, reg, rbp_kind, reason] = input.array()?;
    let cfa_offset = input.i32()?;
    let rbp_offset = input.i32()?;
    let add = input.i32()?;
    let rbp = match rbp_kind {
        0 => RbpRule::Same,
        1 => RbpRule::AtCfa(rbp_offset),
        2 => RbpRule::AtRbp(rbp_offset),
        _ => return Err(InvalidEntry::Corrupt("bad rbp rule")),
    };
    let cfa = match kind {
        KIND_GAP => return Ok(Rule::Gap),
        KIND_END => return Ok(Rule::End),
        KIND_SIGNAL => return Ok(Rule::Signal),
        KIND_RETURN_IN_RDI => return Ok(Rule::ReturnInRdi(cfa_offset)),
        KIND_UNSUPPORTED => {
            let reason =
                UnsupportedReason::from_u8(reason).ok_or(InvalidEntry::Corrupt("bad reason"))?;
            return Ok(Rule::Unsupported(reason));
        }
        KIND_CFA_RSP => Cfa::Rsp(cfa_offset),
        KIND_CFA_RSP_STEPS => Cfa::RspSteps {
            offset: cfa_offset,
            pushes: add as u32 as u16,
            pops: (add as u32 >> 16) as u16,
        },
        KIND_CFA_RBP => Cfa::Rbp(cfa_offset),
        KIND_PLT => Cfa::Plt {
            threshold: u8::try_from(cfa_offset)
                .map_err(|_| InvalidEntry::Corrupt("bad PLT threshold"))?,
        },
        KIND_DEREF => Cfa::Deref {
            reg: match reg {
                6 => Reg::Rbp,
                7 => Reg::Rsp,
                _ => return Err(InvalidEntry::Corrupt("bad register")),
            },
            offset: cfa_offset,
            add,
        },
        _ => return Err(InvalidEntry::Corrupt("bad rule kind")),
    };
    Ok(Rule::Frame { cfa, rbp })
}

fn decode_kind(kind: u8, reason: u8) -> Result<RuleKind, InvalidEntry> {
    Ok(match kind {
        KIND_GAP => RuleKind::Gap,
        KIND_CFA_RSP => RuleKind::CfaRsp,
        KIND_CFA_RSP_STEPS => RuleKind::CfaRspSteps,
        KIND_CFA_RBP => RuleKind::CfaRbp,
        KIND_PLT => RuleKind::Plt,
        KIND_DEREF => RuleKind::Deref,
        KIND_END => RuleKind::End,
        KIND_SIGNAL => RuleKind::Signal,
        KIND_RETURN_IN_RDI => RuleKind::ReturnInRdi,
        KIND_UNSUPPORTED => RuleKind::Unsupported(
            UnsupportedReason::from_u8(reason).ok_or(InvalidEntry::Corrupt("bad reason"))?,
        ),
        _ => return Err(InvalidEntry::Corrupt("bad rule kind")),
    })
}

fn decode(bytes: &[u8], key: &Key) -> Result<CompiledObject, InvalidEntry> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(InvalidEntry::BadMagic);
    }
    let mut input = Input {
        bytes: &bytes[MAGIC.len()..],
    };
    // Versions before the checksum: an entry of another format may checksum differently.
    let format = input.u32()?;
    if format != FORMAT_VERSION {
        return Err(InvalidEntry::FormatVersion { found: format });
    }
    let compiler = input.bytes()?;
    if compiler != COMPILER_VERSION.as_bytes() {
        return Err(InvalidEntry::CompilerVersion {
            found: String::from_utf8_lossy(compiler).into_owned(),
        });
    }
    let header_len = bytes.len() - input.bytes.len();
    let Some(body_len) = bytes.len().checked_sub(8).filter(|&len| len >= header_len) else {
        return Err(InvalidEntry::Corrupt("truncated"));
    };
    let (body, sum) = bytes.split_at(body_len);
    let mut sum_bytes = [0u8; 8];
    sum_bytes.copy_from_slice(sum);
    if checksum(body) != u64::from_le_bytes(sum_bytes) {
        return Err(InvalidEntry::Corrupt("checksum mismatch"));
    }
    let mut input = Input {
        bytes: &body[header_len..],
    };

    let mut expected_key = Vec::new();
    key.encode(&mut expected_key);
    if input.take(expected_key.len())? != expected_key.as_slice() {
        return Err(InvalidEntry::KeyMismatch);
    }
    let build_id = match input.u8()? {
        0 => None,
        1 => Some(input.bytes()?.to_vec()),
        _ => return Err(InvalidEntry::Corrupt("bad build-id flag")),
    };

    let first_page = input.u64()?;
    // Pages and rows are most of an entry (a million rows for the largest libraries):
    // decoded from exact-size chunks, without a bounds check per field.
    let npages = input.count(8)?;
    let pages = input
        .take(npages * 8)?
        .chunks_exact(8)
        .map(|chunk| PageSpan {
            first_row: u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
            nrows: u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]),
        })
        .collect();
    let nrows = input.count(4)?;
    let rows = input
        .take(nrows * 4)?
        .chunks_exact(4)
        .map(|chunk| CompactRow {
            addr_lo: u16::from_le_bytes([chunk[0], chunk[1]]),
            rule: u16::from_le_bytes([chunk[2], chunk[3]]),
        })
        .collect();
    let nrules = input.count(16)?;
    let mut rules = Vec::with_capacity(nrules);
    for _ in 0..nrules {
        rules.push(decode_rule(&mut input)?);
    }
    let table = CompactTable {
        first_page,
        pages,
        rows,
        rules,
    };
    table
        .check()
        .map_err(|invalid| InvalidEntry::Corrupt(invalid.0))?;

    let mut counters = [0u64; 13];
    for counter in &mut counters {
        *counter = input.u64()?;
    }
    let [eh_frame_fdes, debug_frame_fdes, unparsable_fdes, outside_code_fdes, shadowed_fdes, separate_debug_file, cfi_rows, rows, rules, pages, kernel_bytes, code_bytes_with_cfi, code_bytes_supported] =
        counters;
    let nkinds = input.count(18)?;
    let mut kinds = Vec::with_capacity(nkinds);
    for _ in 0..nkinds {
        let [kind, reason] = input.array()?;
        kinds.push(KindCount {
            kind: decode_kind(kind, reason)?,
            rows: input.u64()?,
            bytes: input.u64()?,
        });
    }
    if !input.bytes.is_empty() {
        return Err(InvalidEntry::Corrupt("trailing bytes"));
    }
    let stats = Stats {
        eh_frame_fdes,
        debug_frame_fdes,
        unparsable_fdes,
        outside_code_fdes,
        shadowed_fdes,
        separate_debug_file: separate_debug_file != 0,
        cfi_rows,
        rows,
        rules,
        pages,
        kernel_bytes,
        code_bytes_with_cfi,
        code_bytes_supported,
        kinds,
    };
    Ok(CompiledObject {
        build_id,
        table,
        stats,
    })
}
