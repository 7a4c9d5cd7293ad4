//! The heap profiler's preloaded library (`libcargo-trace-preload.so`, built from `c/`)
//! and cargo-trace's side of in-process recording.
//!
//! # What it does
//! The library wraps the malloc family, `mmap` and `munmap` of a target cargo-trace
//! launches (`LD_PRELOAD`). It runs in one of two modes, chosen at its first call:
//! - **BPF sites** (no `CARGO_TRACE_HEAP` in the environment): after each call it calls a
//!   site, a function starting with a nop, where cargo-trace's uprobes count the call
//!   ([`SITES`]; the BPF programs walk the stack). Behaviour unchanged from before this
//!   crate (the sites where a stack is walked are now assembly: a nop, then a return
//!   unless recording in-process, so both modes walk from the same call instruction).
//! - **In-process recording** (`CARGO_TRACE_HEAP=<socket>`, see [`Server::environment`]):
//!   no kernel event at all. The library connects to the socket, walks its own thread's
//!   stack with the compact unwind tables cargo-trace compiled (the walk of
//!   `docs/walk.md`, in C, `c/walk.h`: the BPF walker's frames and ends), remembers
//!   walks (a per-thread memo that re-reads the words a walk read), interns stacks in
//!   a shared region and publishes each event in its thread's ring.
//!
//! Data flow of in-process recording:
//! ```text
//!  target (library)                         cargo-trace (this crate)
//!  first call: connect ---- hello + region memfd ----> Server::serve
//!                      <--- mappings + tables memfd --  (TableSource: the session's
//!  a pc in no mapping: ---- lookup(pc) -------------->   mappings and tables)
//!                      <--- mappings ----------------
//!  at connection and   ---- hooks? ------------------>  TableSource::hook_targets
//!  _dl_debug_state:    <--- functions ---------------
//!  room mapped near    ---- where (stub, trampoline) ->  TableSource::plan_hook
//!  each, then written  <--- bytes to write ----------
//!                      ---- what was placed -------->  Server::hooks
//!  each call: walk or memo -> stack id -> ring event
//!  region (memfd, shared) ------------------------------> Recorder::poll: orders events,
//!                                                         aggregates per (pid, stack)
//! ```
//! Every shared byte is defined once, in `c/shared.h`, mirrored in [`layout`] with
//! compile-time checks against the C compiler's layout.
//!
//! # Using it from a session
//! ```text
//! let mut server = Server::new()?;            // private dir, library file, socket
//! command.envs(server.environment(std::env::var_os("LD_PRELOAD")));  // then launch
//! let mut recorder = Recorder::new(options);  // the heap options (sampling, sizes)
//! while the target runs {                     // the session's wait loop
//!     server.serve(&mut tables, &mut recorder, timeout)?;  // hellos, lookups, closes
//!     recorder.poll();                        // drain the rings: every 0.1-1 ms while
//!                                             // events flow (64 Ki events a thread)
//!     // live view: recorder.live_bytes(), recorder.events(), recorder.top_live(n)
//!     // the session's own re-read of a pid's mappings found a change:
//!     //     recorder.mappings_changed(pid)   (a library unmapped, another over it)
//! }
//! until server.connections() == 0 { serve; poll }  // children and exec'd images too
//! recorder.poll();
//! // recorder.stats(), processes(), counters(), library_memory(), stacks()
//! ```
//! `tables` is the session's [`TableSource`]: the mappings as it registers them for the
//! BPF walker, with its object ids (frames are stored under them, so one stack is one
//! stack for both paths). A thread that meets a pc in no mapping it knows waits for
//! [`Server::serve`]'s answer: serve often.
//!
//! # What it does not do
//! It knows nothing of BPF (the sites' kinds are its own [`Site`]; cargo-trace maps them
//! to probe kinds), compiles tables only through `unwind_tables` (the [`TableSource`] the
//! session gives decides which), and symbolizes nothing: stacks come out as typed frames
//! ([`Frame`]). It decides no hook: allocators `LD_PRELOAD` cannot interpose (linked
//! into the executable, an allocator's own API in a library) are hooked at their entries
//! (`c/hooks.h`), but which functions and the bytes to write come from the session's
//! [`TableSource::hook_targets`] and [`TableSource::plan_hook`] (cargo-trace decodes the
//! code); the library maps room for the trampolines within reach, writes, and records a
//! hooked call through the same `ctp_record` the sites jump to.

pub mod layout;
mod live;
mod recorder;
mod server;
mod sys;
mod tables;

pub use recorder::{
    AllocStats, Counters, Estimated, Frame, LibraryMemory, MappedTotals, Options, ProcessTotals,
    Recorder, RegionError, Stack, StackId, BUCKETS,
};
pub use server::{Error, Server};
pub use server::{HookOutcome, HookReport};
pub use tables::{
    encode_table, HookCode, HookKind, HookTarget, PlainTables, SourceMapping, TableError,
    TableSource,
};

/// The library, as built by build.rs.
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcargo-trace-preload.so"));

/// The library's file name.
pub const FILE_NAME: &str = "libcargo-trace-preload.so";

/// The environment variable that turns in-process recording on: the socket's path.
pub const SOCKET_VARIABLE: &str = "CARGO_TRACE_HEAP";

/// A BPF site of the library: what cargo-trace attaches there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Site {
    /// `cargo_trace_allocated(address, size, mapped, log, n)`: a block allocated.
    Allocated,
    /// `cargo_trace_freeing(address)`: a block about to be freed.
    Freeing,
    /// `cargo_trace_unmapping(address)`: a mapping about to be unmapped.
    Unmapping,
    /// `cargo_trace_resizing(old, size, log, n)`: before realloc.
    Resizing,
    /// `cargo_trace_resized(new)`: after realloc.
    Resized,
    /// `cargo_trace_freed(log, n)`: a thread's free log, full.
    Freed,
    /// `cargo_trace_log(log)`: where a thread's free log is.
    Log,
}

/// The library's sites (BPF sites mode), by symbol name.
pub const SITES: [(&str, Site); 7] = [
    ("cargo_trace_allocated", Site::Allocated),
    ("cargo_trace_freeing", Site::Freeing),
    ("cargo_trace_unmapping", Site::Unmapping),
    ("cargo_trace_resizing", Site::Resizing),
    ("cargo_trace_resized", Site::Resized),
    ("cargo_trace_freed", Site::Freed),
    ("cargo_trace_log", Site::Log),
];
