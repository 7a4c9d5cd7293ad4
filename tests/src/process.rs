//! A live process as the twin unwinder sees it: its executable mappings with
//! load biases and compiled unwind tables, its memory, and (through ptrace)
//! the registers of its stopped threads.
//!
//! All ptrace use is in [`SeizedThreads`]; nix wraps the syscalls, so this
//! module has no `unsafe`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use object::{Object, ObjectSegment};
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

/// The state letter of process `pid` (`R`, `S`, `T` for stopped...), None once it is
/// gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may hold any byte, so the state follows the last ')'.
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    pub inode: u64,
    /// A path, a pseudo-name like `[vdso]`, or empty for anonymous memory.
    pub name: String,
}

impl MapsEntry {
    pub fn is_executable(&self) -> bool {
        self.perms.contains('x')
    }
}

/// Parses `/proc/PID/maps` text; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines()
        .filter_map(|line| {
            // start-end perms offset dev inode [name]; the name may contain spaces.
            let mut fields = line.splitn(6, ' ');
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?.to_string();
            let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            let _dev = fields.next()?;
            let inode = fields.next()?.parse().ok()?;
            Some(MapsEntry {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms,
                offset,
                inode,
                name: fields.next().unwrap_or("").trim_start().to_string(),
            })
        })
        .collect()
}

/// A loadable segment of an ELF file, as the bias computation needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub file_size: u64,
    pub vaddr: u64,
    /// `PF_X` is set.
    pub executable: bool,
}

/// The load bias (runtime address − ELF virtual address) of the object whose
/// executable mapping starts at `map_start` from file offset `map_offset`.
///
/// The mapping holds the page-aligned start of the executable segment whose
/// file range contains `map_offset` (only an executable one: lld packs the
/// read-only segment and the text into one file page, each with its own
/// vaddr − offset delta): the segment's bytes at file offset `o` are at ELF
/// address `vaddr + (o - file_offset)` and at runtime address
/// `map_start + (o - map_offset)`. The mapping's offset is rounded down to a
/// page while the segment's may not be, so containment is tested from the
/// segment's page-aligned offset; the ELF rules make `vaddr ≡ file_offset`
/// modulo the page size, so the bias comes out page-aligned.
pub fn load_bias(segments: &[LoadSegment], map_start: u64, map_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let segment = segments.iter().filter(|s| s.executable).find(|s| {
        let first = s.file_offset & !(PAGE - 1);
        first <= map_offset && map_offset < s.file_offset + s.file_size.max(1)
    })?;
    Some(
        map_start
            .wrapping_sub(map_offset)
            .wrapping_add(segment.file_offset)
            .wrapping_sub(segment.vaddr),
    )
}

/// The loadable segments of an ELF file, for [`load_bias`].
pub fn load_segments(file: &object::File<'_>) -> Vec<LoadSegment> {
    file.segments()
        .map(|s| {
            let (file_offset, file_size) = s.file_range();
            let executable = match s.flags() {
                object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
                _ => false,
            };
            LoadSegment {
                file_offset,
                file_size,
                vaddr: s.address(),
                executable,
            }
        })
        .collect()
}

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
    let symbols = Symbols::from_elf(&file, Path::new("/usr/lib/debug"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let text = "\
55d0c0a00000-55d0c0a05000 r--p 00000000 08:01 1234                       /usr/bin/true\n\
55d0c0a05000-55d0c0a09000 r-xp 00005000 08:01 1234                       /usr/bin/my prog\n\
7ffd5a1f0000-7ffd5a1f2000 r-xp 00000000 00:00 0                          [vdso]\n\
7f0000000000-7f0000001000 rwxp 00000000 00:00 0 \n\
garbage\n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[1],
            MapsEntry {
                start: 0x55d0c0a05000,
                end: 0x55d0c0a09000,
                perms: "r-xp".into(),
                offset: 0x5000,
                inode: 1234,
                name: "/usr/bin/my prog".into(),
            }
        );
        assert_eq!(maps[2].name, "[vdso]");
        assert_eq!(maps[3].name, "");
        assert!(maps[1].is_executable() && !maps[0].is_executable());
    }

    #[test]
    fn bias_from_segments() {
        // A PIE: text at vaddr 0x1000 from offset 0x1000.
        let pie = [
            LoadSegment {
                file_offset: 0,
                file_size: 0x800,
                vaddr: 0,
                executable: false,
            },
            LoadSegment {
                file_offset: 0x1000,
                file_size: 0x3000,
                vaddr: 0x1000,
                executable: true,
            },
        ];
        assert_eq!(
            load_bias(&pie, 0x5555_5555_5000, 0x1000),
            Some(0x5555_5555_4000)
        );
        // A segment whose offset is not page aligned: vaddr 0x21a0c0 at offset
        // 0x2190c0 is mapped from the page at offset 0x219000.
        let odd = [LoadSegment {
            file_offset: 0x2190c0,
            file_size: 0x5000,
            vaddr: 0x21a0c0,
            executable: true,
        }];
        assert_eq!(
            load_bias(&odd, 0x7f00_0021_a000, 0x219000),
            Some(0x7f00_0000_0000)
        );
        // lld: the read-only segment ends in the file page where the text
        // starts; the text's delta differs, and the mapping is the text's.
        let lld = [
            LoadSegment {
                file_offset: 0,
                file_size: 0x16054,
                vaddr: 0,
                executable: false,
            },
            LoadSegment {
                file_offset: 0x16060,
                file_size: 0x42e20,
                vaddr: 0x17060,
                executable: true,
            },
        ];
        assert_eq!(
            load_bias(&lld, 0x5555_5556_c000, 0x16000),
            Some(0x5555_5555_5000)
        );
        // A non-PIE executable: bias 0.
        let exec = [LoadSegment {
            file_offset: 0x1000,
            file_size: 0x100,
            vaddr: 0x401000,
            executable: true,
        }];
        assert_eq!(load_bias(&exec, 0x401000, 0x1000), Some(0));
        // No segment holds the offset.
        assert_eq!(load_bias(&pie, 0x5555_5555_9000, 0x9000), None);
    }
}
