//! What a Linux process has mapped, and the ELF objects behind it: the one place that
//! reads `/proc/PID/maps`, derives a mapping's load bias, reads build ids and demangles
//! names, for the product and its tests alike.
//!
//! # What it does
//! - [`executable_mappings`]: a process's executable mappings, asked of the kernel one
//!   by one with `PROCMAP_QUERY` (Linux 6.11+) where it can, else parsed from the maps
//!   text ([`parse_maps`]); [`mapped_files`]: the files a process maps.
//! - [`load_bias`]: runtime address minus ELF virtual address of a mapping, from the
//!   executable `PT_LOAD` segment that holds its file offset ([`load_segments`]).
//! - [`build_id`]: an object's GNU build id, hex encoded.
//! - [`Demangled`]: a symbol's names (Rust without hash, C++ with and without its
//!   arguments), and [`demangle`], the name to show.
//!
//! # What it does not do
//! It compiles no unwind table and finds no separate debug file (`unwind-tables` does
//! both), and knows nothing of BPF or probes. The only `unsafe` is the `PROCMAP_QUERY`
//! ioctl, in `maps.rs`.

mod demangle;
mod elf;
mod maps;

pub use demangle::{demangle, Demangled};
pub use elf::{build_id, load_bias, load_bias_of, load_segments, LoadSegment};
pub use maps::{
    executable_mappings, mapped_files, parse_maps, process_state, MappedObject, MapsEntry,
    USER_ADDRESS_END,
};
