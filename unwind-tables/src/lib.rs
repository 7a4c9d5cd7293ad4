//! Compile x86-64 ELF unwind information into compact rows, and walk stacks with them.
//!
//! (crate docs to be completed)

pub mod rule;
pub mod table;

pub use rule::{Cfa, RbpRule, Reg, Rule, UnsupportedReason};
pub use table::{CompactRow, CompactTable, PageSpan, PAGE_SHIFT};
