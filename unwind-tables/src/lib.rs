//! Compile x86-64 ELF unwind information into compact rows, and walk stacks with them.
//!
//! # What it does
//!
//! - [`compile`] / [`compile_file`] turn an ELF object (executable, PIE, shared library,
//!   vdso image) into a [`CompactTable`]: rows sorted by ELF virtual address, each naming
//!   one of a few hundred to a few thousand distinct [`Rule`]s, that cover every code byte
//!   with CFI and mark every byte without it as [`Rule::Gap`]. It is the table the BPF
//!   program searches; the kernel holds 4 bytes per row, 8 per 64 KiB page and 16 per
//!   distinct rule (libc: 15k rows, 75 KB; each push/pop run is one row, see below).
//! - [`walk`] is the userspace twin of the BPF unwinder (docs/walk.md): the reference the BPF
//!   side is tested against.
//! - [`cache::Cache`] keeps compiled objects on disk by build-id, so a second run loads
//!   libc's table in well under a millisecond instead of compiling it again.
//!
//! # What it does not do
//!
//! No BPF, no root, no process inspection, no I/O beyond reading the files it is given (and
//! their separate debug files) and its cache directory; the byte layout the kernel sees
//! belongs to `bpf-prog`, which converts these types. x86-64 only. It never guesses: CFI
//! that does not reduce exactly to a rule the walker executes becomes
//! [`Rule::Unsupported`] with a [`UnsupportedReason`], and an offset that does not fit i32
//! is `OffsetOverflow`, never wrapped. Known consequences, measured by the differential test:
//! - glibc's lazy-binding trampolines (`_dl_runtime_resolve_*`, in ld.so) and OpenSSL's
//!   perlasm leaf functions (linked into cargo) realign rsp and name the CFA from another
//!   register (rbx, rax, rsi, r11…): unsupported (ld.so 98.1% supported, cargo 99.80%).
//!   Frame 0 could execute such a rule (all its registers are in `pt_regs`), and outer
//!   frames too for callee-saved rbx if the walker also restored rbx; either takes a new CFA
//!   variant in the shared rule types, the walk contract and the BPF program.
//!
//! # Data flow
//!
//! ```text
//! ELF bytes (mmap) ──elf──▶ .eh_frame, .debug_frame (own or separate debug file),
//!                           executable ranges, build-id
//!   ──cfi──▶ every FDE evaluated by gimli (UnwindTable), each row reduced to a Rule
//!   ──assemble──▶ overlaps resolved, clipped to code, .debug_frame fills .eh_frame's holes,
//!                 Gap rows made explicit, equal neighbours merged
//!   ──push_pop──▶ each run of pushes and pops merged into one RspSteps row
//!   ──table──▶ CompactTable { pages, rows, distinct rules }  (+ Stats)
//!   ──cache──▶ on disk by build-id          ──bpf-prog──▶ BPF maps
//!                                           ──walk──▶ userspace twin
//! ```
//!
//! # Choices a reader would ask about
//!
//! - **Overlapping FDEs**: an address belongs to the FDE that starts first, then the longest,
//!   then the first in the section; `.eh_frame` always beats `.debug_frame` (it is what the
//!   program's own unwinder uses). `.debug_frame` only fills addresses no `.eh_frame` FDE
//!   covers.
//! - **Undefined registers**: gimli reports "no rule" and `DW_CFA_undefined` alike. No rule
//!   for rbp means unchanged (x86-64 callee-saved convention, as libgcc treats it); an
//!   explicit `DW_CFA_undefined rbp` is unsupported. An explicitly undefined return address
//!   is [`Rule::End`] (`_start`, thread entry); a missing one is unsupported.
//! - **Signal trampolines** (CIE augmentation `S`) are [`Rule::Signal`] only if their CFI
//!   reads rsp, rip and rbp at exactly the [`rule::sigframe`] offsets.
//! - **FDEs outside executable segments** (discarded code tombstoned at 0) are dropped, so
//!   they cannot stretch the page index; a table spanning more than 4 GiB is an error.
//! - **Push/pop merging**: code without frame pointers gets a CFI row after every `push`
//!   and `pop` of its prologues and epilogues, each a byte or two long: about half of all
//!   rows. Since a walker finds the row's start anyway, one row can carry a whole run:
//!   [`Cfa::RspSteps`] keeps the first row's offset and a bit per step within
//!   [`rule::STEP_WINDOW`] bytes (a push or a pop there). It is exact at every byte (the
//!   differential test checks each merged row's pieces against gimli), and it takes libc
//!   from 28k rows / 118 KB to 15k / 75 KB, libLLVM from 1.44M / 5.8 MB to 0.59M / 2.4 MB
//!   (`benches/compile.rs`). [`CompactTable::lookup`] resolves it to the plain rule at an
//!   address; the walkers execute it ([`CompactTable::lookup_in_row`]). A run ends where
//!   the rbp rule changes, so a prologue that pushes rbp midway is two rows; a rule that
//!   could also switch rbp to "saved" at one of its steps would make libc's table about 2%
//!   smaller still, for another operand in every walker.
//! - **`.eh_frame_hdr`** is not needed: walking `.eh_frame` sees every FDE (the header's
//!   table may omit some), and sorting a few thousand FDE ranges costs microseconds.
//! - **Corrupt input**: a broken section structure (entry lengths) is an [`Error::Cfi`]; an
//!   FDE whose header does not parse is skipped and counted; an FDE whose instructions fail
//!   midway keeps its earlier rows and the rest becomes `Unsupported(BadCfi)`. Nothing
//!   panics on any input (fuzzed: see /fuzz).

mod assemble;
pub mod cache;
mod cfi;
mod compile;
mod elf;
mod error;
mod prologue;
mod push_pop;
pub mod rule;
mod stats;
pub mod table;
pub mod walk;

pub use compile::{compile, compile_file, compile_file_with, find_debug_file_path, CompiledObject};
pub use elf::DebugSearch;
pub use error::Error;
pub use rule::{Cfa, RbpRule, Reg, Rule, RuleKind, UnsupportedReason};
pub use stats::{KindCount, Stats};
pub use table::{CompactRow, CompactTable, InvalidTable, PageSpan, PAGE_SHIFT};
