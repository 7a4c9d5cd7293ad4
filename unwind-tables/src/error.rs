//! The errors of this crate. Every way input can be bad is a value here, never a panic.

use std::io;
use std::path::PathBuf;

/// Why an object could not be compiled, or a cache entry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened, mapped or read.
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The bytes do not start with a usable ELF identification.
    #[error("not an ELF file: {0}")]
    NotElf(&'static str),

    /// The bytes are not an ELF file, or its headers are inconsistent (truncated file,
    /// section table out of bounds, bad compressed section, …).
    #[error("not a valid ELF file")]
    Elf(#[from] object::Error),

    /// A compressed section whose header claims an implausible uncompressed size.
    #[error("{section} claims to expand from {compressed} to {size} bytes: corrupt")]
    CompressedSize {
        section: String,
        size: u64,
        compressed: u64,
    },

    /// An ELF file for another architecture. Only x86-64 rules exist.
    #[error("unsupported architecture {0}: only 64-bit little-endian x86-64 ELF is supported")]
    UnsupportedArchitecture(String),

    /// Neither `.eh_frame` nor `.debug_frame` (nor a separate debug file) describes any code.
    #[error("no unwind information: the file has no .eh_frame or .debug_frame covering its code")]
    NoUnwindInfo,

    /// A CFI section whose structure cannot be parsed (entry lengths, CIE pointers). Errors
    /// inside one well-delimited FDE are not fatal: its rows become
    /// `Unsupported(BadCfi)`.
    #[error("corrupt {section} ({})", match after {
        Some(offset) => format!("in the entry after offset {offset:#x}"),
        None => "in its first entry".to_string(),
    })]
    Cfi {
        section: &'static str,
        /// Section offset of the last entry that parsed.
        after: Option<u64>,
        #[source]
        source: gimli::Error,
    },

    /// More distinct rules than a 16-bit row index can name.
    #[error("{count} distinct unwind rules; the compact table allows at most 65536")]
    TooManyRules { count: usize },

    /// The code described by CFI spans more address space than the page index allows.
    #[error(
        "unwind information spans {span:#x} bytes of address space; at most {max:#x} are supported"
    )]
    TableTooLarge { span: u64, max: u64 },
}
