//! Probes: what a user writes after `cargo trace`, and how it becomes attached BPF
//! programs.
//!
//! # What it does
//! - **Parses** probe specs in bpftrace's grammar ([`parse`] → [`ProbeSpec`]):
//!   `uprobe:libc:malloc`, `uretprobe:./prog:myprog::parse`, `profile:hz:99`,
//!   `tracepoint:sched:sched_switch`, `software:page-faults:100`, `usdt:...`, `kprobe:...`,
//!   short forms (`u:`, `ur:`, `t:`, ...). Errors are one line naming the spec and the
//!   expected form; `Display` writes a canonical spec that parses back to the same value.
//!   [`split_list`] splits bpftrace's comma lists and refuses filters and actions.
//! - **Resolves** user-space probes without root ([`resolve_uprobe`], [`resolve_usdt`]):
//!   the binary (path, library short name looked up in the process's mappings then the
//!   library directories, program on `PATH`, or the `-p` process's executable), the
//!   symbol (.symtab then .dynsym; mangled, demangled Rust without hash, C++ with or
//!   without arguments, `*` patterns; close names suggested when missing; a stripped
//!   library's separate debug file, found as the symbolizer finds it, names its static
//!   functions), and its file offset through the PT_LOAD segment that holds it.
//!   A probe never hurts a process: an offset or address past a function's start must
//!   start an instruction (decoded from the function's start with [`iced_x86`]), and no
//!   probe goes on an instruction Linux's uprobes would mishandle ([`HazardKind`]: an
//!   AVX instruction they would skip instead of running, a 5-byte nop they would turn
//!   into a call that crashes forked children); a function starting with one is probed
//!   at its next instruction, an offset, address or USDT site on one is refused. An
//!   IFUNC becomes the implementation its resolver selected in the process (or all it
//!   can select).
//!   [`Notice`]s say what a user should know: the IFUNC's implementation, a moved entry,
//!   a file the process does not map.
//! - **Attaches** a loaded program of the right kind ([`ProbeSpec::program_kind`]) with a
//!   BPF cookie ([`attach_probe`], or per kind: [`attach_uprobe`],
//!   [`attach_perf_event_per_cpu`], [`attach_tracepoint`], [`attach_raw_tracepoint`],
//!   [`attach_kprobe`]). A uprobe fires in every process, in one, or ([`bound`]) in
//!   given processes and all they start, so that untraced processes never trap.
//!   Perf events are opened per online CPU, system-wide. [`detach`]
//!   closes many links from several threads (a tracepoint's close waits for the kernel);
//!   [`libbpf_log`] routes libbpf's own log.
//! - **Detects** kernel features ([`features`]) and turns missing ones into one-line
//!   errors that say what to use instead (no kprobes, no PMU, tracefs unmounted, which it
//!   mounts).
//!
//! # What it does not do
//! It loads no BPF program and knows no map layout (that is `bpf-prog`), reads no
//! unwind information (`unwind-tables`), and does not launch or follow processes
//! (`cargo-trace`). Perf events are not filtered by process here: the BPF program
//! filters by tgid. USDT arguments are not decoded; fentry/fexit, watchpoints and
//! kprobe offsets are not supported.
//!
//! # Data flow
//! ```text
//! "uprobe:libc:malloc" --parse--> ProbeSpec::Uprobe --resolve_uprobe(pid)--> [UprobeTarget
//!   {path, file_offset}] --attach_uprobe(prog, cookie)--> libbpf Link (detaches on drop)
//! spec --attach_probe_with(prog, AttachOptions{resolve_in, fire, ..})--> Attached
//!   {links, notices}
//! "profile:hz:99" --parse--> ProbeSpec::Profile --attach_profile--> perf_event_open per CPU
//!   --> one Link per CPU
//! ```
//! Only the private `sys` module holds `unsafe` code: the perf_event_open and mount
//! system calls.

mod attach;
pub mod bound;
mod detach;
mod elf;
mod error;
mod features;
mod instructions;
mod libbpf_log;
mod maps;
mod notice;
mod perf;
mod resolve;
mod spec;
mod suggest;
mod sys;
#[cfg(test)]
mod testutil;
mod tracefs;
mod wildcard;

pub use attach::{
    attach_interval, attach_kprobe, attach_perf_event_per_cpu, attach_probe, attach_probe_for,
    attach_probe_with, attach_profile, attach_raw_tracepoint, attach_tracepoint, attach_uprobe,
    attach_uprobe_in, attach_uprobes_in, AttachOptions, Attached, Attachment, Fire,
};
pub use bound::{BoundUprobe, UprobeGroup};
pub use detach::{detach, detach_in_background};
pub use error::{AttachError, Error, ResolveError};
pub use features::{features, hardware_support, kprobe_support, Features, Support};
pub use instructions::HazardKind;
pub use libbpf_log::libbpf_log;
pub use notice::Notice;
pub use perf::{online_cpus, open_perf_events_per_cpu, PerfEventKind};
pub use resolve::{
    cheaper_entries, resolve_binary, resolve_uprobe, resolve_uprobe_with, resolve_usdt,
    CheaperEntry, ResolveOptions, UprobeTarget,
};
pub use spec::{
    parse, split_list, HardwareEvent, KprobeSpec, Lang, ParseError, ProbeSpec, ProgramKind, Rate,
    Sampling, SoftwareEvent, UprobeLocation, UprobeSpec, UsdtSpec,
};
pub use tracefs::{ensure_tracefs, expand_tracepoints, tracefs_root, TRACEFS};
