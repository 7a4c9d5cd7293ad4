//! An allocator named (`alloc:jemalloc`, `alloc:mimalloc`, `alloc:PATH`,
//! `--alloc-prefix`), recorded in the process: exactly the functions the BPF path probes
//! for it ([`allocators::resolve`]), each hooked at its entry, in every object a process
//! maps, those the wrappers reach included (libjemalloc.so's malloc).
//!
//! Where libc's functions are among them (`alloc:libc`, `--alloc-prefix`, which count
//! libc too, `alloc:PATH` naming libc), the wrappers record libc's calls as with `alloc`.
//! Where they are not, the wrappers record nothing and pass every call through with a
//! tail jump (`CTP_OPT_WRAPPERS_PASS`, `preload/c/preload.c`): a hooked function they
//! reach sees the program's frame as its caller, as the BPF path, which runs without the
//! library, sees it; and no wrapper's call is in progress to make it count as part of one.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use super::{
    check_function, code_offset, defined_functions, hook_kind, start_walks_where_bpf_probes,
    Function, ObjectFunctions, Refusal,
};
use crate::alloc::allocators::{self, allocator_named, AllocFunction, Allocator};

/// The allocator's functions in the objects of a process, by their file's (device, inode).
type Objects = HashMap<(u64, u64), Arc<ObjectFunctions>>;

/// An allocator named, and what was found of it in each process.
#[derive(Clone)]
pub struct Named {
    allocator: Allocator,
    prefix: Option<String>,
    /// libc's functions are the allocator's (or among them): the wrappers record them.
    wrappers_count: bool,
    /// The functions of each object file, by (device, inode) and the functions' names.
    objects: HashMap<(u64, u64, Vec<String>), Arc<ObjectFunctions>>,
    /// What a process's executable mappings gave, by their files (device, inode): a
    /// shell loop's processes, all alike, are resolved once.
    by_mappings: HashMap<Vec<(String, u64)>, Result<Objects, String>>,
    /// Why the allocator was not found in a process, by pid.
    unresolved: HashMap<u32, String>,
}

impl Named {
    /// `allocator` as named, with `prefix` (`--alloc-prefix`); `None` for plain `alloc`,
    /// whose allocators the hooks' own rule finds.
    pub fn new(allocator: &Allocator, prefix: Option<&str>) -> Option<Named> {
        let wrappers_count = match allocator {
            Allocator::Auto if prefix.is_none() => return None,
            Allocator::Auto | Allocator::Libc => true,
            Allocator::Binary(path) => is_libc(Path::new(path)),
            Allocator::Jemalloc | Allocator::Mimalloc => false,
        };
        Some(Named {
            allocator: allocator.clone(),
            prefix: prefix.map(str::to_string),
            wrappers_count,
            objects: HashMap::new(),
            by_mappings: HashMap::new(),
            unresolved: HashMap::new(),
        })
    }

    /// Whether the wrappers record their calls (libc's functions are the allocator's);
    /// else they pass every call through.
    pub fn wrappers_count(&self) -> bool {
        self.wrappers_count
    }

    /// Finds the allocator in process `pid`, for the error that says why it is not there.
    pub fn resolve(&self, pid: u32) -> anyhow::Result<()> {
        allocators::entries(&self.allocator, self.prefix.as_deref(), pid).map(|_| ())
    }

    /// Why the allocator was not found in process `pid`, if it was not.
    pub fn unresolved(&self, pid: u32) -> Option<&str> {
        self.unresolved.get(&pid).map(String::as_str)
    }

    /// Before the launch: `Err` with the one line that says why, when a function of the
    /// allocator in the executable (or in `alloc:PATH`'s file) cannot be hooked, or that
    /// file cannot be read. (A library's function found later that cannot be hooked is
    /// named in a warning, as with `alloc`.)
    pub fn check(&self, executable: &Path) -> Result<(), String> {
        let object = match &self.allocator {
            Allocator::Binary(path) => probes::resolve_binary(path, None).map_err(|error| {
                format!("{path} could not be found before the launch ({error})")
            })?,
            _ => executable.to_path_buf(),
        };
        if self.wrappers_count && is_libc(&object) {
            return Ok(());
        }
        let unreadable = |error: &dyn std::fmt::Display| {
            format!("{} could not be read ({error})", object.display())
        };
        let file = std::fs::File::open(&object).map_err(|e| unreadable(&e))?;
        // SAFETY: a read-only private map of a file we only read.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| unreadable(&e))?;
        let elf = object::File::parse(&*map).map_err(|e| unreadable(&e))?;
        let segments = process_image::load_segments(&elf);
        let defined = defined_functions(&elf);
        for (name, kind) in allocators::names_of(&self.allocator, self.prefix.as_deref()) {
            let Some(&(address, size)) = defined.get(&name) else {
                continue;
            };
            let cannot = |why: &dyn std::fmt::Display| {
                format!("{name} of {} cannot be hooked ({why})", object.display())
            };
            let Some(hook) = hook_kind(kind) else {
                return Err(cannot(&"no hook takes its arguments"));
            };
            let function = Function {
                name: name.clone(),
                kind: hook,
                leaf: address,
                alloc_kind: Some(kind),
                address,
                size,
                file_offset: code_offset(&segments, address, size).unwrap_or(0),
            };
            check_function(&object, &function).map_err(|refusal| cannot(&refusal))?;
        }
        Ok(())
    }

    /// The allocator's functions in the objects process `pid` maps now (`mappings`, its
    /// executable ones), by the (device, inode) of their file: those
    /// [`allocators::entries`] finds, less libc's when the wrappers record them.
    pub(super) fn objects(&mut self, pid: u32, mappings: &[process_image::MapsEntry]) -> Objects {
        let mut files: Vec<(String, u64)> = mappings
            .iter()
            .filter(|m| m.inode != 0)
            .map(|m| (m.dev.clone(), m.inode))
            .collect();
        files.sort_unstable();
        files.dedup();
        let found = match self.by_mappings.get(&files) {
            Some(found) => found.clone(),
            None => {
                let found = self.find(pid);
                self.by_mappings.insert(files, found.clone());
                found
            }
        };
        match found {
            Ok(objects) => {
                self.unresolved.remove(&pid);
                objects
            }
            Err(why) => {
                self.unresolved.insert(pid, why);
                Objects::new()
            }
        }
    }

    /// [`Named::objects`], found in process `pid`.
    fn find(&mut self, pid: u32) -> Result<Objects, String> {
        let found = allocators::entries(&self.allocator, self.prefix.as_deref(), pid)
            .map_err(|error| format!("{error:#}"))?;
        let mut by_path: Vec<(&Path, Vec<&AllocFunction>)> = Vec::new();
        for function in &found {
            let path = function.target.path.as_path();
            match by_path.iter_mut().find(|(p, _)| *p == path) {
                Some((_, functions)) => functions.push(function),
                None => by_path.push((path, vec![function])),
            }
        }
        let mut objects = HashMap::new();
        for (path, functions) in by_path {
            if self.wrappers_count && is_libc(path) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(path) else {
                continue;
            };
            let names: Vec<String> = functions.iter().map(|f| f.target.symbol.clone()).collect();
            let key = (meta.dev(), meta.ino(), names);
            let object = match self.objects.get(&key) {
                Some(object) => Arc::clone(object),
                None => {
                    let Ok(object) = object_functions(path, &functions) else {
                        continue;
                    };
                    let object = Arc::new(object);
                    self.objects.insert(key, Arc::clone(&object));
                    object
                }
            };
            objects.insert((meta.dev(), meta.ino()), object);
        }
        Ok(objects)
    }
}

/// Whether the object at `path` is libc, by its file name.
fn is_libc(path: &Path) -> bool {
    allocator_named(path, &[]).0 == "libc"
}

/// `functions` of the object at `path` (found at their entries), as hooks take them.
fn object_functions(path: &Path, functions: &[&AllocFunction]) -> Result<ObjectFunctions, Refusal> {
    let unreadable = |e: &dyn std::fmt::Display| Refusal::Unreadable(e.to_string());
    let file = std::fs::File::open(path).map_err(|e| unreadable(&e))?;
    // SAFETY: a read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| unreadable(&e))?;
    let elf = object::File::parse(&*map).map_err(|e| unreadable(&e))?;
    let segments = process_image::load_segments(&elf);
    let defined = defined_functions(&elf);
    let mut hooked = Vec::new();
    for function in functions {
        let symbol = &function.target.symbol;
        let name = symbol.split('+').next().unwrap_or(symbol).to_string();
        let address = function.target.address;
        // Its size from its symbol (0, refused as such, if it has none).
        let size = defined
            .get(&name)
            .filter(|(at, _)| *at == address)
            .map_or(0, |&(_, size)| size);
        // A kind no hook takes (mmap): `Named::check` sent such a session to the BPF
        // path before the launch.
        let Some(kind) = hook_kind(function.kind) else {
            continue;
        };
        hooked.push(Function {
            name,
            kind,
            leaf: address,
            alloc_kind: Some(function.kind),
            address,
            size,
            file_offset: code_offset(&segments, address, size)
                .unwrap_or(function.target.file_offset),
        });
    }
    start_walks_where_bpf_probes(path, &mut hooked);
    Ok(ObjectFunctions {
        segments,
        functions: hooked,
    })
}
