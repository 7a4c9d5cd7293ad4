//! A live process as the twin unwinder sees it: its executable mappings with
//! load biases and compiled unwind tables, its memory, and (through ptrace)
//! the registers of its stopped threads.
//!
//! All ptrace use is in [`SeizedThreads`]; nix wraps the syscalls, so this
//! module has no `unsafe`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use unwind_tables::walk::{AddressSpace, Mapping, Memory, Registers};
use unwind_tables::{CompactTable, CompiledObject};

use crate::symbols::Symbols;

/// Why a process could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("compiling the unwind table of {path}: {source}")]
    Compile {
        path: PathBuf,
        source: unwind_tables::Error,
    },
    #[error("{path} is not an ELF file object can read: {source}")]
    Elf {
        path: PathBuf,
        source: object::Error,
    },
    #[error("no PT_LOAD segment of {path} holds file offset {offset:#x}")]
    NoSegment { path: PathBuf, offset: u64 },
    #[error("{0}")]
    BadMapping(#[from] unwind_tables::walk::BadMapping),
    #[error("thread {tid} did not stop after PTRACE_SEIZE: {status}")]
    NotStopped { tid: i32, status: String },
    #[error("ptrace {what} of thread {tid}: {source}")]
    Ptrace {
        what: &'static str,
        tid: i32,
        source: nix::Error,
    },
}

pub use process_image::{
    load_bias, load_segments, parse_maps, process_state, LoadSegment, MapsEntry,
};

/// One ELF object mapped executable in the process, with its table and symbols.
pub struct LoadedObject {
    /// The path from `/proc/PID/maps`, or `[vdso]`.
    pub name: String,
    pub compiled: CompiledObject,
    pub symbols: Symbols,
}

impl LoadedObject {
    /// The file name of [`LoadedObject::name`] (`libc.so.6`, `chains`, `[vdso]`).
    pub fn short_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// An executable mapping and the object it maps (`None`: anonymous code, no table).
#[derive(Clone, Debug)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub object: Option<usize>,
}

/// The executable mappings of a process with the unwind tables of their objects.
pub struct ProcessImage {
    pub pid: i32,
    pub objects: Vec<LoadedObject>,
    pub mappings: Vec<ExecMapping>,
    empty: CompactTable,
}

impl ProcessImage {
    /// Reads `/proc/PID/maps` and compiles (with `unwind_tables::compile_file`)
    /// the table of every object mapped executable, once per object. The vDSO
    /// is read from the process's memory and compiled from bytes.
    pub fn load(pid: i32) -> Result<ProcessImage, InspectError> {
        let maps_path = PathBuf::from(format!("/proc/{pid}/maps"));
        let text = std::fs::read_to_string(&maps_path).map_err(|source| InspectError::Io {
            what: "reading",
            path: maps_path,
            source,
        })?;
        let memory = ProcMemory::open(pid)?;
        let mut objects: Vec<LoadedObject> = Vec::new();
        let mut segments_of: Vec<Vec<LoadSegment>> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut mappings = Vec::new();
        for entry in parse_maps(&text)
            .into_iter()
            .filter(MapsEntry::is_executable)
        {
            let object = if entry.name.starts_with('/') || entry.name == "[vdso]" {
                let index = match by_name.get(&entry.name) {
                    Some(&index) => index,
                    None => {
                        let (object, segments) = load_object(&entry, &memory)?;
                        objects.push(object);
                        segments_of.push(segments);
                        by_name.insert(entry.name.clone(), objects.len() - 1);
                        objects.len() - 1
                    }
                };
                Some(index)
            } else {
                // [vsyscall] (kernel-emulated, no ELF) or anonymous code (JIT).
                None
            };
            let bias = match object {
                Some(index) => load_bias(&segments_of[index], entry.start, entry.offset)
                    .ok_or_else(|| InspectError::NoSegment {
                        path: entry.name.clone().into(),
                        offset: entry.offset,
                    })?,
                None => 0,
            };
            mappings.push(ExecMapping {
                start: entry.start,
                end: entry.end,
                bias,
                object,
            });
        }
        Ok(ProcessImage {
            pid,
            objects,
            mappings,
            empty: CompactTable::default(),
        })
    }

    /// The mappings as the walker takes them (anonymous code gets an empty table).
    pub fn address_space(&self) -> Result<AddressSpace<'_>, InspectError> {
        let mappings = self
            .mappings
            .iter()
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                table: m
                    .object
                    .map_or(&self.empty, |index| &self.objects[index].compiled.table),
            })
            .collect();
        Ok(AddressSpace::new(mappings)?)
    }

    /// The mapping and object that hold `addr`.
    pub fn object_at(&self, addr: u64) -> Option<(&ExecMapping, &LoadedObject)> {
        let mapping = self
            .mappings
            .iter()
            .find(|m| m.start <= addr && addr < m.end)?;
        Some((mapping, &self.objects[mapping.object?]))
    }

    /// Names the code at runtime address `addr`.
    pub fn symbolize(&self, addr: u64) -> Frame {
        match self.object_at(addr) {
            Some((mapping, object)) => Frame {
                pc: addr,
                object: object.short_name().to_string(),
                names: object.symbols.names_at(addr.wrapping_sub(mapping.bias)),
            },
            None => Frame {
                pc: addr,
                object: String::new(),
                names: Vec::new(),
            },
        }
    }

    /// Symbolizes walked frames: the first at its pc, the others (return
    /// addresses) at `pc - 1`, inside the call. [`Frame::pc`] stays the walked value.
    pub fn symbolize_walk(&self, pcs: &[u64]) -> Vec<Frame> {
        pcs.iter()
            .enumerate()
            .map(|(index, &pc)| Frame {
                pc,
                ..self.symbolize(if index == 0 { pc } else { pc.wrapping_sub(1) })
            })
            .collect()
    }

    /// The runtime address of symbol `name` in the object whose file name is `object`.
    pub fn symbol_address(&self, object: &str, name: &str) -> Option<u64> {
        self.mappings.iter().find_map(|m| {
            let loaded = &self.objects[m.object?];
            if loaded.short_name() != object {
                return None;
            }
            let vaddr = loaded.symbols.address_of(name)?;
            let runtime = vaddr.wrapping_add(m.bias);
            (m.start <= runtime && runtime < m.end).then_some(runtime)
        })
    }
}

fn load_object(
    entry: &MapsEntry,
    memory: &ProcMemory,
) -> Result<(LoadedObject, Vec<LoadSegment>), InspectError> {
    let path = PathBuf::from(&entry.name);
    let data = if entry.name == "[vdso]" {
        memory
            .read_bytes(entry.start, (entry.end - entry.start) as usize)
            .ok_or_else(|| InspectError::Io {
                what: "reading the vDSO of",
                path: memory.path.clone(),
                source: std::io::Error::other("short read"),
            })?
    } else {
        std::fs::read(&path).map_err(|source| InspectError::Io {
            what: "reading",
            path: path.clone(),
            source,
        })?
    };
    let compiled = if entry.name == "[vdso]" {
        unwind_tables::compile(&data)
    } else {
        unwind_tables::compile_file(&path)
    }
    .map_err(|source| InspectError::Compile {
        path: path.clone(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| InspectError::Elf {
        path: path.clone(),
        source,
    })?;
    let segments = load_segments(&file);
    let symbols = Symbols::from_elf(&file, (entry.name != "[vdso]").then_some(path.as_path()));
    Ok((
        LoadedObject {
            name: entry.name.clone(),
            compiled,
            symbols,
        },
        segments,
    ))
}

/// A symbolized frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub pc: u64,
    /// File name of the object (`libc.so.6`, `chains`, `[vdso]`); empty when unmapped.
    pub object: String,
    /// Every symbol name (aliases) of the innermost function containing the
    /// pc; empty when no symbol does (e.g. a stripped library's static function).
    pub names: Vec<String>,
}

impl Frame {
    pub fn is(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.names.is_empty() {
            "??".to_string()
        } else {
            self.names.join(" = ")
        };
        write!(
            f,
            "{:#014x} {name} ({})",
            self.pc,
            if self.object.is_empty() {
                "unmapped"
            } else {
                &self.object
            }
        )
    }
}

/// A process's memory, read through `/proc/PID/mem` (the reader must be
/// allowed to ptrace the process: its tracer, or root).
pub struct ProcMemory {
    file: File,
    path: PathBuf,
}

impl ProcMemory {
    pub fn open(pid: i32) -> Result<ProcMemory, InspectError> {
        let path = PathBuf::from(format!("/proc/{pid}/mem"));
        let file = File::open(&path).map_err(|source| InspectError::Io {
            what: "opening",
            path: path.clone(),
            source,
        })?;
        Ok(ProcMemory { file, path })
    }

    pub fn read_bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }
}

impl Memory for ProcMemory {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut buf = [0; 8];
        self.file.read_exact_at(&mut buf, addr).ok()?;
        Some(u64::from_le_bytes(buf))
    }
}

/// One thread of a stopped process, held by ptrace.
#[derive(Clone, Debug)]
pub struct StoppedThread {
    pub tid: i32,
    /// `/proc/PID/task/TID/comm`.
    pub name: String,
    pub regs: Registers,
}

/// Every thread of a process, seized with `PTRACE_SEIZE` while the process is
/// stopped (group-stop), so they stay stopped and their registers can be read.
/// Dropping detaches them; they return to the group-stop, which a SIGCONT ends.
///
/// ptrace requests must come from the thread that seized: keep this value on
/// one thread.
pub struct SeizedThreads {
    pub threads: Vec<StoppedThread>,
    seized: Vec<Pid>,
}

impl SeizedThreads {
    pub fn seize(pid: i32) -> Result<SeizedThreads, InspectError> {
        let task_dir = PathBuf::from(format!("/proc/{pid}/task"));
        let io = |what, source| InspectError::Io {
            what,
            path: task_dir.clone(),
            source,
        };
        let mut tids: Vec<i32> = std::fs::read_dir(&task_dir)
            .map_err(|e| io("listing", e))?
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        tids.sort_unstable();
        let mut seized = SeizedThreads {
            threads: Vec::new(),
            seized: Vec::new(),
        };
        for &tid in &tids {
            let pid = Pid::from_raw(tid);
            ptrace::seize(pid, ptrace::Options::empty()).map_err(|source| {
                InspectError::Ptrace {
                    what: "seize",
                    tid,
                    source,
                }
            })?;
            seized.seized.push(pid);
            // A seized thread that was in group-stop reports a stop; wait for
            // it so the thread is known to be in the traced state.
            match waitpid(pid, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..)) => {}
                Ok(status) => {
                    return Err(InspectError::NotStopped {
                        tid,
                        status: format!("{status:?}"),
                    })
                }
                Err(source) => {
                    return Err(InspectError::Ptrace {
                        what: "wait",
                        tid,
                        source,
                    })
                }
            }
            let regs = ptrace::getregs(pid).map_err(|source| InspectError::Ptrace {
                what: "getregs",
                tid,
                source,
            })?;
            let name = std::fs::read_to_string(task_dir.join(tid.to_string()).join("comm"))
                .map(|s| s.trim_end().to_string())
                .unwrap_or_default();
            seized.threads.push(StoppedThread {
                tid,
                name,
                regs: Registers {
                    rip: regs.rip,
                    rsp: regs.rsp,
                    rbp: regs.rbp,
                    rdi: Some(regs.rdi),
                },
            });
        }
        Ok(seized)
    }
}

impl Drop for SeizedThreads {
    fn drop(&mut self) {
        for &pid in &self.seized {
            let _ = ptrace::detach(pid, None);
        }
    }
}

/// The byte at file offset `offset` of `path` as process `pid` sees it in its executable
/// mapping of the file (read through `/proc/PID/mem`): int3 (0xcc) where a uprobe
/// patched it in this process, the file's own byte otherwise. `None` if the process is
/// gone or does not map that part of the file executable.
pub fn mapped_code_byte(pid: u32, path: &std::path::Path, offset: u64) -> Option<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = path.canonicalize().ok()?;
    let entry = parse_maps(&maps).into_iter().find(|entry| {
        entry.perms.contains('x')
            && std::path::Path::new(&entry.name) == path
            && (entry.offset..entry.offset + (entry.end - entry.start)).contains(&offset)
    })?;
    let address = entry.start + (offset - entry.offset);
    let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut byte = [0u8];
    mem.read_exact_at(&mut byte, address).ok()?;
    Some(byte[0])
}
