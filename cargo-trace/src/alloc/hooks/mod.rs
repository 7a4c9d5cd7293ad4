//! Hooks on the allocator functions the preloaded library's wrappers cannot reach: which
//! functions, and the bytes that hook one (the library places them: `preload/c/hooks.h`).
//!
//! `LD_PRELOAD` reaches only the calls the dynamic linker binds to libc's names. An
//! allocator linked into the executable (tikv-jemallocator's `_rjem_*`, the mimalloc
//! crate's `mi_*`, rustc's unprefixed jemalloc, which the executable exports before the
//! library in the lookup order), an allocator's own API in a library (`mi_malloc` in
//! libmimalloc, jemalloc's `mallocx`), and a library's calls to its own definitions are
//! never seen by a wrapper. Their entries get a jump to the library instead.
//!
//! Which functions, per object a process maps ([`Planner::targets`]), by its symbols (for
//! `alloc`; an allocator named, `alloc:jemalloc`, takes its own functions: [`Named`]):
//! - an allocator's own API (every name of the allocator tables but libc's unprefixed
//!   malloc API): always;
//! - libc's names (`malloc`, `free`, ...) defined in the executable: always (it comes
//!   first in the lookup order, so even the library's wrappers would call it);
//! - libc's names defined in a library: only when the library calls none of those it
//!   defines through its own dynamic relocations (a PLT or GOT entry naming one). With
//!   one, it was built to be interposed: its calls and every other object's go through
//!   the dynamic linker's lookup, which finds the wrapper first (libc itself,
//!   libjemalloc.so); without, its own calls go straight to its definitions, which no
//!   wrapper sees. A wrapper that calls a hooked function counts the call once: the hook
//!   passes it through (`in_call`).
//!
//! The preloaded library itself is never hooked. Of the dynamic linker, only
//! `_dl_debug_state`, which it calls when a dlopen has mapped what it loads (before their
//! constructors): the library hooks their allocators then. It is a lone `ret`; the hook
//! displaces the padding after it too, checked to be nothing but `nop`s up to the next
//! 16-byte boundary (no function starts before it).
//!
//! The bytes ([`plan`]): the function's first instructions, at least the 5 bytes of a
//! `jmp rel32`, decoded whole (`iced-x86`), relocated to the trampoline the library
//! mapped within reach, and a jump back after them; the entry's jump to the library's
//! stub. A function is refused when it is shorter than that, when its body (its size
//! from the symbol) branches into the displaced bytes (past the first), or when they
//! hold what cannot be relocated; the session says which and what is not counted.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bpf_prog::AllocKind;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, OpKind,
};
use object::{Object, ObjectSymbol, ObjectSymbolTable, SymbolFlags};
use preload::{HookCode, HookKind, HookTarget};

use super::allocators::allocator_api;
pub use named::Named;

mod named;

/// The dynamic linker's function it calls when its objects are consistent again.
pub const DEBUG_STATE: &str = "_dl_debug_state";

/// The bytes of the jump written at a hooked entry.
const JUMP: usize = 5;

/// Why a function cannot be hooked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("its symbol has no size, so its body cannot be checked")]
    NoSize,
    #[error("it is shorter than the {JUMP}-byte jump a hook writes")]
    TooShort,
    #[error("an instruction at +{0:#x} could not be decoded")]
    Undecodable(u64),
    #[error("it branches to +{0:#x}, inside the instructions a hook displaces")]
    BranchTarget(u64),
    #[error("a displaced instruction cannot run elsewhere ({0})")]
    NotRelocatable(String),
    #[error("its trampoline takes {0} bytes, more than the {1} there is room for")]
    TooLong(usize, usize),
    #[error("the library's stub is beyond a 32-bit jump from its entry")]
    TooFar,
    #[error("its code could not be read: {0}")]
    Unreadable(String),
}

/// The bytes that hook the function whose code (from its entry to its end, as its
/// symbol's size says) is `code`, at runtime address `entry`: the entry's `jmp` to
/// `stub`, and the trampoline at `trampoline` (at most `room` bytes) that runs the
/// displaced instructions and jumps back to the first one left in place.
pub fn plan(
    code: &[u8],
    entry: u64,
    stub: u64,
    trampoline: u64,
    room: usize,
) -> Result<HookCode, Refusal> {
    if code.is_empty() {
        return Err(Refusal::NoSize);
    }
    if code.len() < JUMP {
        return Err(Refusal::TooShort);
    }
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut displaced = Vec::new();
    let mut instruction = Instruction::default();
    let mut length = 0usize;
    while length < JUMP {
        if !decoder.can_decode() {
            return Err(Refusal::TooShort);
        }
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            return Err(Refusal::Undecodable(length as u64));
        }
        match instruction.flow_control() {
            FlowControl::Interrupt | FlowControl::Exception | FlowControl::XbeginXabortXend => {
                return Err(Refusal::NotRelocatable(format!("{:?}", instruction.code())));
            }
            _ => {}
        }
        length += instruction.len();
        displaced.push(instruction);
    }
    // The whole body: a branch into the displaced bytes would land in the middle of the
    // jump. The entry itself may be a target (a loop back to it goes through the hook,
    // nested, and passes straight through).
    let mut body = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    while body.can_decode() {
        body.decode_out(&mut instruction);
        if instruction.is_invalid() {
            // Past the displaced bytes, what does not decode (padding, data) is no branch.
            continue;
        }
        let branches = matches!(
            instruction.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        if branches {
            let target = instruction.near_branch_target();
            if target > entry && target < entry + length as u64 {
                return Err(Refusal::BranchTarget(target - entry));
            }
        }
    }
    let back = Instruction::with_branch(Code::Jmp_rel32_64, entry + length as u64)
        .map_err(|e| Refusal::NotRelocatable(e.to_string()))?;
    displaced.push(back);
    let encoded = BlockEncoder::encode(
        64,
        InstructionBlock::new(&displaced, trampoline),
        BlockEncoderOptions::NONE,
    )
    .map_err(|e| Refusal::NotRelocatable(e.to_string()))?;
    let code = encoded.code_buffer;
    if code.len() > room {
        return Err(Refusal::TooLong(code.len(), room));
    }
    let relative = stub.wrapping_sub(entry + JUMP as u64) as i64;
    let relative = i32::try_from(relative).map_err(|_| Refusal::TooFar)?;
    let mut patch = vec![0xe9];
    patch.extend_from_slice(&relative.to_le_bytes());
    Ok(HookCode { patch, code })
}

/// The argument shape of an allocator table's kind, for the hook's wrapper; `None` for
/// the kinds no hook takes (mmap, the library's own sites).
fn hook_kind(kind: AllocKind) -> Option<HookKind> {
    Some(match kind {
        AllocKind::SizeArg0 => HookKind::SizeArg0,
        AllocKind::SizeArg1 => HookKind::SizeArg1,
        AllocKind::Calloc => HookKind::Calloc,
        AllocKind::Realloc => HookKind::Realloc,
        AllocKind::ReallocArray => HookKind::ReallocArray,
        AllocKind::PosixMemalign => HookKind::PosixMemalign,
        AllocKind::Free => HookKind::Free,
        AllocKind::Xallocx => HookKind::Xallocx,
        _ => return None,
    })
}

/// A function of an object that a hook takes.
#[derive(Clone, Debug)]
struct Function {
    name: String,
    kind: HookKind,
    /// Where the walk of a call starts (ELF address): where the BPF path probes it.
    leaf: u64,
    /// Its kind in the allocator tables (`None`: the dynamic linker's function).
    alloc_kind: Option<AllocKind>,
    /// Its ELF address and size, and where its code is in the file.
    address: u64,
    size: u64,
    file_offset: u64,
}

/// What a hook needs of one object file.
struct ObjectFunctions {
    segments: Vec<process_image::LoadSegment>,
    functions: Vec<Function>,
}

/// Whether an object is never hooked: the preloaded library (its wrappers).
fn never_hooked(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()) == Some(preload::FILE_NAME)
}

/// Whether the object at `path` is the dynamic linker.
fn is_dynamic_linker(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|name| name.starts_with("ld-linux") || name.starts_with("ld-"))
        && path.to_string_lossy().contains(".so")
}

/// The dynamic linker's `_dl_debug_state` as a function to hook: its `ret` and the
/// padding after it up to the next 16-byte boundary past the jump's 5 bytes, if that is
/// all `nop`s.
fn debug_state(
    elf: &object::File<'_>,
    data: &[u8],
    segments: &[process_image::LoadSegment],
) -> Option<Function> {
    let symbol = elf.dynamic_symbols().chain(elf.symbols()).find(|s| {
        s.name()
            .is_ok_and(|n| n.split('@').next() == Some(DEBUG_STATE))
    })?;
    let address = symbol.address();
    let end = (address + JUMP as u64 + 15) & !15;
    let segment = segments
        .iter()
        .find(|s| s.executable && address >= s.vaddr && end <= s.vaddr + s.file_size)?;
    let file_offset = segment.file_offset + (address - segment.vaddr);
    let code = data.get(file_offset as usize..(file_offset + end - address) as usize)?;
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let first = decoder.decode();
    if first.mnemonic() != iced_x86::Mnemonic::Ret || first.len() != 1 {
        return None;
    }
    while decoder.can_decode() {
        let padding = decoder.decode();
        if padding.is_invalid()
            || !matches!(
                padding.mnemonic(),
                iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3
            )
        {
            return None;
        }
    }
    Some(Function {
        name: DEBUG_STATE.to_string(),
        kind: HookKind::DebugState,
        leaf: address,
        alloc_kind: None,
        address,
        size: end - address,
        file_offset,
    })
}

/// The functions of the object at `path` to hook (the rule at the top of this module);
/// `executable`: it is the process's executable.
fn functions_of(path: &Path, executable: bool) -> Result<ObjectFunctions, Refusal> {
    let unreadable = |e: &dyn std::fmt::Display| Refusal::Unreadable(e.to_string());
    let file = std::fs::File::open(path).map_err(|e| unreadable(&e))?;
    // SAFETY: a read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| unreadable(&e))?;
    let elf = object::File::parse(&*map).map_err(|e| unreadable(&e))?;
    let segments = process_image::load_segments(&elf);
    if is_dynamic_linker(path) {
        // Refused with no size when it is not a lone `ret` in its padding: the session
        // names it, and what dlopen brings goes unhooked.
        let function = debug_state(&elf, &map, &segments).unwrap_or(Function {
            name: DEBUG_STATE.to_string(),
            kind: HookKind::DebugState,
            leaf: 0,
            alloc_kind: None,
            address: 0,
            size: 0,
            file_offset: 0,
        });
        return Ok(ObjectFunctions {
            functions: vec![function],
            segments,
        });
    }
    // The names its own dynamic relocations bind: calls that go through the lookup.
    let mut relocated = std::collections::HashSet::new();
    if let (Some(relocations), Some(symbols)) =
        (elf.dynamic_relocations(), elf.dynamic_symbol_table())
    {
        for (_, relocation) in relocations {
            if let object::RelocationTarget::Symbol(index) = relocation.target() {
                if let Ok(name) = symbols.symbol_by_index(index).and_then(|s| s.name()) {
                    relocated.insert(name.split('@').next().unwrap_or(name).to_string());
                }
            }
        }
    }
    let defined = defined_functions(&elf);
    let api = allocator_api();
    let interposed = !executable
        && api.iter().any(|(name, _, libc_name)| {
            *libc_name && defined.contains_key(name) && relocated.contains(name)
        });
    let mut functions: Vec<Function> = Vec::new();
    for (name, kind, libc_name) in api {
        let Some(&(address, size)) = defined.get(&name) else {
            continue;
        };
        let alloc_kind = kind;
        let Some(kind) = hook_kind(kind) else {
            continue;
        };
        if libc_name && interposed {
            continue;
        }
        // Aliases (one function, two names) are hooked once.
        if functions.iter().any(|f| f.address == address) {
            continue;
        }
        let Some(file_offset) = code_offset(&segments, address, size) else {
            continue;
        };
        functions.push(Function {
            name,
            kind,
            leaf: address,
            alloc_kind: Some(alloc_kind),
            address,
            size,
            file_offset,
        });
    }
    start_walks_where_bpf_probes(path, &mut functions);
    Ok(ObjectFunctions {
        segments,
        functions,
    })
}

/// The functions `elf` defines, by name (versions dropped): their ELF address and size.
/// Functions only: an IFUNC's address is its resolver's.
fn defined_functions(elf: &object::File<'_>) -> HashMap<String, (u64, u64)> {
    let mut defined: HashMap<String, (u64, u64)> = HashMap::new();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        let is_function = matches!(symbol.flags(), SymbolFlags::Elf { st_info, .. }
            if st_info & 0xf == object::elf::STT_FUNC);
        if symbol.is_undefined() || !is_function {
            continue;
        }
        if let Ok(name) = symbol.name() {
            let name = name.split('@').next().unwrap_or(name).to_string();
            defined
                .entry(name)
                .or_insert((symbol.address(), symbol.size()));
        }
    }
    defined
}

/// Where the code of the function at ELF `address`, `size` bytes long, is in its file:
/// `None` outside the executable segments.
fn code_offset(segments: &[process_image::LoadSegment], address: u64, size: u64) -> Option<u64> {
    segments
        .iter()
        .filter(|s| s.executable)
        .find(|s| address >= s.vaddr && address + size <= s.vaddr + s.file_size)
        .map(|s| s.file_offset + (address - s.vaddr))
}

/// Sets the leaf of each allocating function of `functions` (of the object at `path`)
/// where the BPF path probes it: past its first instructions when they only move values
/// between registers (`probes::cheaper_entries`): rsp, rbp and memory as at the entry,
/// so a walk from there is the walk from the entry, and its leaf frame the BPF path's
/// (inline frames included).
fn start_walks_where_bpf_probes(path: &Path, functions: &mut [Function]) {
    let allocating: Vec<usize> = (0..functions.len())
        .filter(|&i| {
            functions[i]
                .alloc_kind
                .is_some_and(|kind| !kind.frees_only())
        })
        .collect();
    let entries: Vec<u64> = allocating.iter().map(|&i| functions[i].address).collect();
    if let Ok(cheaper) = probes::cheaper_entries(path, &entries) {
        for (&i, entry) in allocating.iter().zip(cheaper) {
            if functions[i]
                .alloc_kind
                .is_some_and(|kind| kind.reading_moved(&entry.holds).is_some())
            {
                functions[i].leaf = entry.address;
            }
        }
    }
}

/// The code of `function` in the file at `path`.
fn code_of(path: &Path, function: &Function) -> Result<Vec<u8>, Refusal> {
    let mut code = vec![0u8; function.size as usize];
    std::fs::File::open(path)
        .and_then(|file| file.read_exact_at(&mut code, function.file_offset))
        .map_err(|e| Refusal::Unreadable(e.to_string()))?;
    Ok(code)
}

/// A function's name, and whether it can be hooked.
pub type Checked = (String, Result<(), Refusal>);

/// Each allocator function of the executable at `path` that a hook would take, and
/// whether it can be hooked: planned as the library would place it (a trampoline within
/// reach), before the executable runs.
pub fn check_executable(path: &Path) -> Result<Vec<Checked>, Refusal> {
    let object = functions_of(path, true)?;
    Ok(object
        .functions
        .iter()
        .map(|function| (function.name.clone(), check_function(path, function)))
        .collect())
}

/// Whether `function` of the file at `path` can be hooked: planned as the library would
/// place it (a trampoline within reach).
fn check_function(path: &Path, function: &Function) -> Result<(), Refusal> {
    let code = code_of(path, function)?;
    let near = function.address + (64 << 20);
    plan(&code, function.address, near, near + 48, preload_room()).map(|_| ())
}

/// The room the library gives a trampoline.
fn preload_room() -> usize {
    preload::layout::HOOK_ROOM
}

/// Finds the functions to hook in a process and plans their hooks; remembers each object
/// file it read (a session may start the same program many times).
#[derive(Default)]
pub struct Planner {
    /// By (path, device, inode, is the executable).
    objects: HashMap<(PathBuf, u64, u64, bool), Arc<ObjectFunctions>>,
    /// Each target told, by (pid, entry): its object file and function, to plan it.
    told: HashMap<(u32, u64), (PathBuf, Function)>,
    /// The allocator named, whose functions are hooked in place of those the rule at the
    /// top of this module chooses.
    named: Option<Named>,
}

impl Planner {
    /// A planner of the functions of `named`, or with `None` of the allocators the
    /// wrappers do not reach.
    pub fn new(named: Option<Named>) -> Planner {
        Planner {
            named,
            ..Planner::default()
        }
    }

    /// The allocator named, if one is.
    pub fn named(&self) -> Option<&Named> {
        self.named.as_ref()
    }

    /// The allocator functions of the objects process `pid` maps now that its library's
    /// wrappers do not reach; for an allocator named, its functions.
    pub fn targets(&mut self, pid: u32) -> Vec<HookTarget> {
        let Ok(mappings) = process_image::executable_mappings(pid) else {
            return Vec::new();
        };
        let named = self
            .named
            .as_mut()
            .map(|named| named.objects(pid, &mappings));
        let executable = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let mut targets: Vec<HookTarget> = Vec::new();
        for mapping in &mappings {
            let process_image::MappedObject::File(path) = mapping.object() else {
                continue;
            };
            if never_hooked(&path) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let is_executable = executable.as_deref() == Some(path.as_path());
            let key = (path.clone(), meta.dev(), meta.ino(), is_executable);
            let named_object = match &named {
                // Of the dynamic linker, `_dl_debug_state` as always.
                Some(_) if is_dynamic_linker(&path) => None,
                Some(objects) => match objects.get(&(meta.dev(), meta.ino())) {
                    Some(object) => Some(Arc::clone(object)),
                    None => continue,
                },
                None => None,
            };
            let object = match named_object.or_else(|| self.objects.get(&key).cloned()) {
                Some(object) => object,
                None => {
                    let Ok(object) = functions_of(&path, is_executable) else {
                        continue;
                    };
                    let object = Arc::new(object);
                    self.objects.insert(key, Arc::clone(&object));
                    object
                }
            };
            if object.functions.is_empty() {
                continue;
            }
            let Some(bias) =
                process_image::load_bias(&object.segments, mapping.start, mapping.offset)
            else {
                continue;
            };
            for function in &object.functions {
                let entry = bias.wrapping_add(function.address);
                if entry < mapping.start
                    || entry >= mapping.end
                    || targets.iter().any(|t| t.entry == entry)
                {
                    continue;
                }
                self.told
                    .insert((pid, entry), (path.clone(), function.clone()));
                targets.push(HookTarget {
                    entry,
                    leaf: bias.wrapping_add(function.leaf),
                    kind: function.kind,
                    name: function.name.clone(),
                    object: path.clone(),
                });
            }
        }
        targets
    }

    /// The bytes that hook `target` of process `pid` (see [`plan`]).
    pub fn plan(
        &self,
        pid: u32,
        target: &HookTarget,
        stub: u64,
        trampoline: u64,
        room: usize,
    ) -> Result<HookCode, Refusal> {
        let (path, function) = self
            .told
            .get(&(pid, target.entry))
            .ok_or_else(|| Refusal::Unreadable("not a function listed".to_string()))?;
        let code = code_of(path, function)?;
        plan(&code, target.entry, stub, trampoline, room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function's code from this machine's libc, by name.
    fn libc_function(name: &str) -> (Vec<u8>, u64) {
        let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let data = std::fs::read(path).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let symbol = elf
            .dynamic_symbols()
            .find(|s| s.name().ok().map(|n| n.split('@').next().unwrap()) == Some(name))
            .unwrap_or_else(|| panic!("no {name} in libc"));
        let segments = process_image::load_segments(&elf);
        let address = symbol.address();
        let segment = segments
            .iter()
            .find(|s| s.executable && address >= s.vaddr && address < s.vaddr + s.file_size)
            .unwrap();
        let offset = (segment.file_offset + address - segment.vaddr) as usize;
        (
            data[offset..offset + symbol.size() as usize].to_vec(),
            address,
        )
    }

    /// Decodes `code` at `address`, as text per instruction.
    fn disassemble(code: &[u8], address: u64) -> Vec<String> {
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let mut out = Vec::new();
        while decoder.can_decode() {
            let instruction = decoder.decode();
            out.push(format!("{:?}", instruction.code()));
        }
        out
    }

    /// glibc's malloc, hooked: the entry jumps to the stub, and the trampoline runs the
    /// displaced instructions, then jumps back right after them.
    #[test]
    fn libc_malloc_is_planned() {
        let (code, entry) = libc_function("malloc");
        let entry = entry + 0x7f00_0000_0000;
        let stub = entry - 0x10_0000;
        let trampoline = stub + 24;
        let hook = plan(&code, entry, stub, trampoline, 80).unwrap();
        assert_eq!(hook.patch[0], 0xe9);
        let relative = i32::from_le_bytes(hook.patch[1..5].try_into().unwrap());
        assert_eq!((entry + 5).wrapping_add(relative as i64 as u64), stub);
        // The trampoline ends with a jump back into malloc, past what it displaced.
        let mut decoder = Decoder::with_ip(64, &hook.code, trampoline, DecoderOptions::NONE);
        let mut last = Instruction::default();
        let mut count = 0;
        while decoder.can_decode() {
            decoder.decode_out(&mut last);
            count += 1;
        }
        assert!(count >= 2, "{:?}", disassemble(&hook.code, trampoline));
        assert_eq!(last.flow_control(), FlowControl::UnconditionalBranch);
        let back = last.near_branch_target();
        assert!(back >= entry + 5 && back < entry + 20, "{back:#x}");
    }

    /// Every function of libc's malloc API plans or is refused for a stated reason, never
    /// a panic; free (a NULL test and a branch first) and calloc plan.
    #[test]
    fn libc_functions_plan() {
        for name in [
            "free",
            "calloc",
            "realloc",
            "posix_memalign",
            "aligned_alloc",
        ] {
            let (code, entry) = libc_function(name);
            let result = plan(&code, entry, entry + 0x1000, entry + 0x1018, 80);
            assert!(result.is_ok(), "{name}: {result:?}");
        }
    }

    /// A RIP-relative operand in the displaced instructions is relocated to the
    /// trampoline's address: the moved instruction still reads what it read.
    #[test]
    fn rip_relative_operands_are_relocated() {
        // mov rax, [rip+0x1000]; push rbx; ret
        let code = [0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00, 0x53, 0xc3];
        let entry = 0x40_0000;
        let trampoline = 0x50_0000;
        let hook = plan(&code, entry, trampoline - 24, trampoline, 80).unwrap();
        let moved = Decoder::with_ip(64, &hook.code, trampoline, DecoderOptions::NONE).decode();
        assert_eq!(moved.memory_base(), iced_x86::Register::RIP);
        assert_eq!(moved.ip_rel_memory_address(), entry + 7 + 0x1000);
    }

    /// The refusals: too short, a branch into the displaced bytes, no size.
    #[test]
    fn unhookable_functions_are_refused() {
        // xor eax, eax; ret
        assert_eq!(
            plan(&[0x31, 0xc0, 0xc3], 0x1000, 0x2000, 0x2018, 80).unwrap_err(),
            Refusal::TooShort
        );
        // test edi, edi; je +0 (to the nop after it, displaced); nop; ...; ret
        let code = [0x85, 0xff, 0x74, 0x00, 0x90, 0x90, 0x90, 0xc3];
        assert_eq!(
            plan(&code, 0x1000, 0x2000, 0x2018, 80).unwrap_err(),
            Refusal::BranchTarget(4)
        );
        assert_eq!(
            plan(&[], 0x1000, 0x2000, 0x2018, 80).unwrap_err(),
            Refusal::NoSize
        );
    }

    /// The fixtures' allocator crates (tikv-jemallocator's `_rjem_*`, the mimalloc
    /// crate's `mi_*`, linked into the executable): every function their programs carry
    /// can be hooked.
    #[test]
    fn the_allocator_crates_can_be_hooked() {
        for (feature, function) in [("jemalloc", "_rjem_malloc"), ("mimalloc", "mi_free")] {
            let path = cargo_trace_tests::fixtures::cargo_fixture("alloc_crates", feature)
                .unwrap_or_else(|e| panic!("building alloc_crates with {feature}: {e}"));
            let functions = check_executable(&path).unwrap();
            assert!(
                functions.iter().any(|(name, _)| name == function),
                "{feature}: {functions:?}"
            );
            for (name, hookable) in &functions {
                assert!(hookable.is_ok(), "{feature}: {name}: {hookable:?}");
            }
        }
    }

    /// libc defines the malloc API and calls it through its own relocations: the
    /// wrappers reach it, so nothing of it is hooked.
    #[test]
    fn libc_is_not_hooked() {
        let object = functions_of(Path::new("/lib/x86_64-linux-gnu/libc.so.6"), false).unwrap();
        let names: Vec<&str> = object.functions.iter().map(|f| f.name.as_str()).collect();
        assert!(names.is_empty(), "{names:?}");
    }

    /// Of the dynamic linker, `_dl_debug_state` alone: its `ret` and the padding after it
    /// displaced, the `ret` first in the trampoline.
    #[test]
    fn the_dynamic_linker_hooks_its_debug_state() {
        let linker = Path::new("/lib64/ld-linux-x86-64.so.2");
        let object = functions_of(linker, false).unwrap();
        let debug_state = &object.functions[..];
        assert_eq!(debug_state.len(), 1, "the dynamic linker's _dl_debug_state");
        let code = code_of(linker, &debug_state[0]).unwrap();
        let address = debug_state[0].address;
        let hook = plan(&code, address, address + 0x1000, address + 0x1018, 80).unwrap();
        assert_eq!(hook.code[0], 0xc3, "its ret, relocated");
    }
}
