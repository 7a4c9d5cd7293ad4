//! What a run can lose, and the options that raise each capacity it can reach: the one
//! table the summary line, the writers and the heap report take the options from.
//!
//! The kernel counts what its programs lose ([`Loss`], [`AllocCounter`]); cargo-trace
//! counts what did not fit in the maps it fills itself (an object's unwind table, a file
//! mapping for the walker, a process's mappings). Each count is reported as a [`Lost`]
//! with the options that raise the limit; a count no option changes (a hash collision)
//! names none.

use std::collections::BTreeMap;

use bpf_prog::{AllocCounter, Loss, TableMap};

use profile::Lost;

/// One way a run loses information or meets a capacity, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    /// A counter of the kernel's `losses` map ([`Loss::ProcsFull`] also counts the
    /// processes whose mappings cargo-trace could not register).
    Loss(Loss),
    /// Objects left without their unwind table: one of the table maps had no room.
    Table(TableMap),
    /// File mappings the walker was not told of: the map of files had no room.
    FileMap,
    /// Processes with more executable mappings than the walker holds for one
    /// ([`bpf_prog::MAX_MAPPINGS`], fixed in the BPF program): those past it (anonymous
    /// code first) end walks with "no mapping".
    MappingsPerProcess,
    /// A counter of the heap programs.
    Heap(AllocCounter),
}

impl Limit {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Loss(loss) => loss.name(),
            Limit::Table(TableMap::Rows) => "table rows full",
            Limit::Table(TableMap::Pages) => "table pages full",
            Limit::Table(TableMap::Rules) => "table rules full",
            Limit::Table(TableMap::Tables) => "tables full",
            Limit::FileMap => "file map full",
            Limit::MappingsPerProcess => "processes past 512 mappings",
            Limit::Heap(counter) => counter.name(),
        }
    }

    /// The command-line options that raise the capacity met, any one of which helps;
    /// none for a count that is no capacity.
    pub fn raised_by(self) -> &'static [&'static str] {
        match self {
            Limit::Loss(loss) => match loss {
                Loss::CountMapFull => &["--max-counts"],
                Loss::StackRingFull => &["--ring-buffer-mib"],
                Loss::KnownStacksFull => &["--max-stacks"],
                // The counts map and the ring buffer were both full.
                Loss::CountLost => &["--max-counts", "--ring-buffer-mib"],
                // The pid filter, the map of processes and the ring of new images are
                // all sized for the processes traced at once.
                Loss::PidFilterFull | Loss::ProcsFull | Loss::NewImagesFull => &["--max-processes"],
                Loss::OffCpuFull => &["--max-off-cpu-threads"],
                Loss::StackNotStored
                | Loss::HashCollision
                | Loss::KernelStackLost
                | Loss::TooNested
                | Loss::InExec
                | Loss::Exiting
                | Loss::KernelThread
                | Loss::TargetElsewhere => &[],
            },
            Limit::Table(TableMap::Rows) => &["--max-table-rows"],
            Limit::Table(TableMap::Pages) => &["--max-table-pages"],
            Limit::Table(TableMap::Rules) => &["--max-table-rules"],
            Limit::Table(TableMap::Tables) => &["--max-tables"],
            Limit::FileMap => &["--max-files"],
            Limit::MappingsPerProcess => &[],
            Limit::Heap(counter) => match counter {
                AllocCounter::LiveMapFull => &["--max-live-blocks"],
                // The statistics per stack, or the totals per process.
                AllocCounter::StatsMapFull => &["--max-heap-stacks", "--max-processes"],
                AllocCounter::UnknownFrees
                | AllocCounter::Failed
                | AllocCounter::NoEntry
                | AllocCounter::Reused
                | AllocCounter::LogsUnread => &[],
            },
        }
    }

    /// `count` of it, as reports show it.
    pub fn lost(self, count: u64) -> Lost {
        Lost {
            what: self.name().to_string(),
            count,
            raised_by: self.raised_by(),
        }
    }
}

/// Counts by limit: those met so far.
pub type Counts = BTreeMap<Limit, u64>;

/// Adds one to the count of `limit`.
pub fn count(counts: &mut Counts, limit: Limit) {
    *counts.entry(limit).or_default() += 1;
}

/// The counts that are not zero, in the order of [`Limit`] (the kernel's losses first).
pub fn reported(counts: &Counts) -> Vec<Lost> {
    counts
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(limit, count)| limit.lost(*count))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn every_limit() -> impl Iterator<Item = Limit> {
        let losses = Loss::ALL.into_iter().map(Limit::Loss);
        let tables = TableMap::ALL.into_iter().map(Limit::Table);
        let heap = AllocCounter::ALL.into_iter().map(Limit::Heap);
        losses
            .chain(tables)
            .chain([Limit::FileMap, Limit::MappingsPerProcess])
            .chain(heap)
    }

    #[test]
    fn every_option_named_is_one_the_command_line_takes() {
        let command = crate::cli::Cli::command();
        let longs: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_long())
            .map(|long| format!("--{long}"))
            .collect();
        for limit in every_limit() {
            for option in limit.raised_by() {
                assert!(longs.iter().any(|l| l == option), "{limit:?}: {option}");
            }
        }
    }

    #[test]
    fn every_map_that_fills_names_an_option() {
        let full: Vec<Limit> = every_limit()
            .filter(|limit| limit.name().contains("full"))
            .collect();
        assert!(full.len() >= 14, "{full:?}");
        for limit in full {
            assert!(!limit.raised_by().is_empty(), "{limit:?}");
        }
    }

    #[test]
    fn the_mapping_cap_is_the_programs() {
        let name = Limit::MappingsPerProcess.name();
        assert!(name.contains(&bpf_prog::MAX_MAPPINGS.to_string()), "{name}");
    }

    #[test]
    fn counts_are_reported_kernel_losses_first_with_their_options() {
        let mut counts = Counts::new();
        count(&mut counts, Limit::FileMap);
        count(&mut counts, Limit::FileMap);
        counts.insert(Limit::Loss(Loss::KnownStacksFull), 5);
        counts.insert(Limit::Loss(Loss::HashCollision), 0);
        let shown: Vec<String> = reported(&counts).iter().map(Lost::to_string).collect();
        assert_eq!(
            shown,
            [
                "known stacks full 5 (--max-stacks)",
                "file map full 2 (--max-files)"
            ]
        );
    }
}
