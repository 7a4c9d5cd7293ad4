//! The compiler's entry points: ELF bytes or a path in, a [`CompiledObject`] out.

use std::fs::File;
use std::path::Path;

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian, UnwindContext};
use memmap2::Mmap;

use crate::assemble::{self, Discarded};
use crate::cfi::{self, Collected};
use crate::elf::{self, DebugSearch, ElfInput};
use crate::error::Error;
use crate::prologue;
use crate::push_pop;
use crate::stats::Stats;
use crate::table::CompactTable;

/// The unwind table of one ELF object and what went into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledObject {
    /// The object's GNU build-id, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// Rows addressed by ELF virtual address (the walker subtracts the load bias).
    pub table: CompactTable,
    pub stats: Stats,
}

/// Compiles the CFI of an x86-64 ELF image in memory: its `.eh_frame`, and its own
/// `.debug_frame` where `.eh_frame` has no FDE.
pub fn compile(elf: &[u8]) -> Result<CompiledObject, Error> {
    let input = elf::parse(elf)?;
    compile_input(&input, None)
}

/// Compiles an ELF file, also looking for a separate debug file (by build-id under
/// `/usr/lib/debug/.build-id`, or by `.gnu_debuglink`) when the file has no `.debug_frame`
/// of its own.
pub fn compile_file(path: impl AsRef<Path>) -> Result<CompiledObject, Error> {
    compile_file_with(path.as_ref(), &DebugSearch::default())
}

/// [`compile_file`] with explicit debug-file search directories.
pub fn compile_file_with(
    path: impl AsRef<Path>,
    search: &DebugSearch,
) -> Result<CompiledObject, Error> {
    let path = path.as_ref();
    let map = map_file(path)?;
    compile_mapped(path, &map, search)
}

/// Compiles an already mapped file; `path` locates its debug file.
pub(crate) fn compile_mapped(
    path: &Path,
    data: &[u8],
    search: &DebugSearch,
) -> Result<CompiledObject, Error> {
    let input = elf::parse(data)?;
    let debug_map = if input.debug_frame.is_none() {
        find_debug_file(path, &input, search)
    } else {
        None
    };
    // find_debug_file parsed and checked it already; a second parse is microseconds.
    let debug_input = debug_map.as_ref().and_then(|map| elf::parse(map).ok());
    compile_input(&input, debug_input.as_ref())
}

/// Maps a file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap, Error> {
    let io_error = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    // SAFETY: the map is only read. If another process truncates the file meanwhile, reads
    // past the new end fault (SIGBUS); every ELF reader that maps files has this risk, and
    // package managers and linkers replace binaries by rename rather than rewrite them in
    // place, so a mapped inode does not change under us in practice.
    unsafe { Mmap::map(&file) }.map_err(io_error)
}

/// The first candidate debug file that is an x86-64 ELF with a `.debug_frame` and provably
/// belongs to this object (see [`matching_debug_files`]).
fn find_debug_file(path: &Path, input: &ElfInput<'_>, search: &DebugSearch) -> Option<Mmap> {
    matching_debug_files(path, input, search)
        .find(|(_, map)| elf::parse(map).is_ok_and(|debug| debug.debug_frame.is_some()))
        .map(|(_, map)| map)
}

/// Candidate debug files that are x86-64 ELF files and provably belong to this object: same
/// build-id, or (when the object has none) the CRC its `.gnu_debuglink` records. Candidates
/// that fail are skipped: the debug file is an optional extra, and a stale or broken one must
/// not prevent using the object itself.
fn matching_debug_files<'a>(
    path: &'a Path,
    input: &'a ElfInput<'_>,
    search: &DebugSearch,
) -> impl Iterator<Item = (std::path::PathBuf, Mmap)> + 'a {
    let debuglink = input.debuglink.map(|(name, _)| name);
    let own = std::fs::canonicalize(path).ok();
    search
        .candidates(path, input.build_id, debuglink)
        .into_iter()
        .filter_map(move |candidate| {
            if !candidate.is_file() || std::fs::canonicalize(&candidate).ok() == own {
                return None;
            }
            let map = map_file(&candidate).ok()?;
            let debug = elf::parse(&map).ok()?;
            let belongs = match (input.build_id, debug.build_id) {
                (Some(ours), Some(theirs)) => ours == theirs,
                (Some(_), None) => false,
                (None, _) => input
                    .debuglink
                    .is_some_and(|(_, crc)| elf::crc32(&map) == crc),
            };
            drop(debug);
            belongs.then_some((candidate, map))
        })
}

/// The separate debug file of the ELF file at `path` (by build-id under the search's debug
/// directories, or by `.gnu_debuglink`), for tools that want its DWARF or full symbol table.
pub fn find_debug_file_path(path: &Path, search: &DebugSearch) -> Option<std::path::PathBuf> {
    let map = map_file(path).ok()?;
    let input = elf::parse(&map).ok()?;
    let found = matching_debug_files(path, &input, search)
        .next()
        .map(|(candidate, _)| candidate);
    found
}

fn compile_input(
    input: &ElfInput<'_>,
    separate_debug: Option<&ElfInput<'_>>,
) -> Result<CompiledObject, Error> {
    let mut stats = Stats::default();
    let mut ctx = UnwindContext::new();
    let mut discarded = Discarded::default();

    let mut eh = Collected::default();
    if let Some(section) = &input.eh_frame {
        let mut bases = BaseAddresses::default().set_eh_frame(section.address);
        if let Some(address) = input.eh_frame_hdr_address {
            bases = bases.set_eh_frame_hdr(address);
        }
        if let Some(address) = input.text_address {
            bases = bases.set_text(address);
        }
        if let Some(address) = input.got_address {
            bases = bases.set_got(address);
        }
        let mut eh_frame = EhFrame::new(&section.data, LittleEndian);
        eh_frame.set_address_size(8);
        cfi::collect(&eh_frame, ".eh_frame", &bases, &mut ctx, &mut eh)?;
    }

    let (debug_section, separate) = match (
        &input.debug_frame,
        separate_debug.and_then(|d| d.debug_frame.as_ref()),
    ) {
        (Some(own), _) => (Some(own), false),
        (None, Some(theirs)) => (Some(theirs), true),
        (None, None) => (None, false),
    };
    let mut debug = Collected::default();
    if let Some(section) = debug_section {
        let mut debug_frame = DebugFrame::new(&section.data, LittleEndian);
        debug_frame.set_address_size(8);
        // .debug_frame addresses are absolute: no bases.
        cfi::collect(
            &debug_frame,
            ".debug_frame",
            &BaseAddresses::default(),
            &mut ctx,
            &mut debug,
        )?;
        stats.separate_debug_file = separate;
    }

    stats.eh_frame_fdes = eh.fde_count;
    stats.debug_frame_fdes = debug.fde_count;
    stats.unparsable_fdes = eh.unparsable + debug.unparsable;
    stats.cfi_rows = eh.cfi_rows + debug.cfi_rows;
    if eh.fdes.is_empty() && debug.fdes.is_empty() {
        // FDEs exist but no header parsed: that is garbage, not an object without CFI.
        let first_error =
            |collected: &Collected, section| collected.first_error.map(|e| (section, e));
        if let Some((section, (offset, source))) =
            first_error(&eh, ".eh_frame").or_else(|| first_error(&debug, ".debug_frame"))
        {
            return Err(Error::Cfi {
                section,
                after: Some(offset),
                source,
            });
        }
    }

    let primary = assemble::resolve(&eh, &input.code, &mut discarded);
    let secondary = assemble::resolve(&debug, &input.code, &mut discarded);
    drop((eh, debug));
    let pieces = assemble::fill_gaps(primary, &secondary);
    if pieces.is_empty() {
        return Err(Error::NoUnwindInfo);
    }
    let pieces = prologue::fill(pieces, &input.code_bytes);
    let pieces = assemble::cover_entry(pieces, input.entry, &input.code);
    let rows = assemble::to_rows(&pieces);
    // Merged rows name more distinct rules; should they ever overflow a row's 16-bit rule
    // index, the unmerged table is as exact.
    let table = match CompactTable::from_sorted_rows(&push_pop::merge(&rows)) {
        Err(Error::TooManyRules { .. }) => CompactTable::from_sorted_rows(&rows)?,
        merged => merged?,
    };

    stats.outside_code_fdes = discarded.outside_code;
    stats.shadowed_fdes = discarded.shadowed;
    stats.measure_table(&table);
    Ok(CompiledObject {
        build_id: input.build_id.map(<[u8]>::to_vec),
        table,
        stats,
    })
}
