//! End-to-end tests of cargo-trace and the fixture programs they run.
//!
//! What this crate does:
//! - [`fixtures`] builds the programs of `tests/fixtures/` from source (Rust,
//!   C, C++; all without frame pointers) into `target/fixtures`, once per
//!   change of source, flags or compiler. No fixture binary is checked in.
//! - [`expected`] states what each fixture does as data — its malloc sites,
//!   their counts and the call chain above each — and parses what the
//!   fixtures print, so tests compare a profile with the fixture's own count.
//! - [`process`] and [`symbols`] inspect a live, stopped process the way the
//!   BPF unwinder sees it (mappings, load biases, compiled unwind tables,
//!   registers through ptrace, memory through `/proc/PID/mem`) so that the
//!   userspace twin (`unwind_tables::walk`) can be run on real stacks.
//! - [`pprof`] decodes pprof files with types generated from pprof's published
//!   `profile.proto`, independently of cargo-trace's writer.
//!
//! What it does not do: symbolize like cargo-trace (it reads ELF symbol
//! tables only, so that it can check cargo-trace's symbolizer rather than
//! share its mistakes).
//!
//! The tests are in `tests/tests/`: `fixtures.rs` (the fixtures build, run,
//! print what they promise and have no frame pointers) and `real_stack.rs`
//! (the twin unwinder reproduces full stacks of stopped fixtures).

pub mod expected;
pub mod fixtures;
pub mod pprof;
pub mod process;
pub mod symbols;
