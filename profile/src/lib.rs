//! cargo-trace's profile model and its writers.
//!
//! # What it does
//!
//! - [`Profile`] is what a session measured, symbolized: samples with several values
//!   each (one per [`ValueType`]: events, CPU time, bytes allocated, ...), pointing to
//!   [`Location`]s (an address in a [`Mapping`], expanded into its inline [`Frame`]s),
//!   with the run's counters ([`Summary`]), [`Metadata`] and, for a heap profile,
//!   [`HeapTotals`]. [`heap`] names the heap's values, histograms and metrics.
//! - [`writers`] turn a profile into files: the SVG flamegraph, folded stacks, pprof,
//!   JSON, speedscope, the HTML report, the heap's text report, CSV, heaptrack's format,
//!   and the closing summary line. [`writers::Format`] is the one list of them.
//! - [`diff`] compares two profiles written earlier (folded or pprof) as a differential
//!   flamegraph.
//!
//! # What it does not do
//!
//! Nothing of how a profile was collected: no BPF, no processes, no symbol files. A
//! collector fills samples and totals; a symbolizer turns its addresses into frames; the
//! model knows neither. Where the bytes of an output go (which file, created how) is the
//! caller's business too.
//!
//! # Data flow
//!
//! ```text
//! collector counts ─symbolizer─▶ Profile ─writers::Format::write─▶ bytes
//! folded / pprof files ─diff::fold─▶ diff::differential_lines ─diff::draw─▶ SVG
//! ```

pub mod diff;
pub mod heap;
mod model;
pub mod units;
pub mod writers;

pub use model::{
    AllocatorCounted, AllocatorsMissed, CountedBy, Frame, HeapPoint, HeapProcess, HeapSums,
    HeapTotals, Location, LocationId, Lost, MappedMemory, MappedProcess, Mapping, MappingId,
    Metadata, ProcessAllocators, Profile, RecorderMemory, Sample, SamplingMode, Summary,
    TimelinePoint, ValueType, MERGED_PID,
};
