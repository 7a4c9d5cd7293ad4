//! The heap profile's vocabulary: the value types of a heap sample, the histograms'
//! buckets, and what a heap profile can be weighed and ordered by. Collectors fill
//! samples with these values; writers read them by these names.

use crate::model::ValueType;

/// Buckets of each heap histogram: bucket k counts sizes (or lifetimes in nanoseconds)
/// of bit length k, the last one everything longer.
pub const BUCKETS: usize = 48;

/// The heap's value types, by kind.
pub const ALLOCS: &str = "allocs";
pub const ALLOC_SPACE: &str = "alloc_space";
pub const FREES: &str = "frees";
pub const FREED_SPACE: &str = "freed_space";
pub const LEAKED_BLOCKS: &str = "leaked_blocks";
pub const LEAKED_BYTES: &str = "leaked_bytes";
pub const TEMPORARIES: &str = "temporaries";
pub const PEAK_BYTES: &str = "peak_bytes";
/// The sum of the ages of the blocks leaked, at the end: their mean age is this over
/// their count.
pub const LEAKED_AGE: &str = "leaked_age";
pub const UNTRACKED: &str = "untracked";
/// `size_bucket_K`: allocations of sizes of bit length K.
pub const SIZE_BUCKET: &str = "size_bucket_";
/// `lifetime_bucket_K`: frees of blocks whose lifetime in nanoseconds has bit length K.
pub const LIFETIME_BUCKET: &str = "lifetime_bucket_";

/// The counters of a heap sample, in the order of [`value_types`].
const COUNTERS: [(&str, &str); 10] = [
    (ALLOCS, "count"),
    (ALLOC_SPACE, "bytes"),
    (FREES, "count"),
    (FREED_SPACE, "bytes"),
    (LEAKED_BLOCKS, "count"),
    (LEAKED_BYTES, "bytes"),
    (TEMPORARIES, "count"),
    (PEAK_BYTES, "bytes"),
    (LEAKED_AGE, "microseconds"),
    (UNTRACKED, "count"),
];

/// Whether a value type is one bucket of a heap histogram: a value for tables and
/// reports, not one to draw a flamegraph of.
pub fn is_bucket(kind: &str) -> bool {
    kind.starts_with(SIZE_BUCKET) || kind.starts_with(LIFETIME_BUCKET)
}

/// Whether a value type is one of a heap sample's ([`value_types`]), rather than one of
/// another probe's in the same session.
pub fn is_heap_value(kind: &str) -> bool {
    is_bucket(kind) || COUNTERS.iter().any(|&(counter, _)| counter == kind)
}

/// The value types of a heap sample, in order: counters, then the size histogram's
/// buckets, then the lifetime histogram's.
pub fn value_types() -> Vec<ValueType> {
    let mut types: Vec<ValueType> = COUNTERS
        .iter()
        .map(|(kind, unit)| ValueType::new(kind, unit))
        .collect();
    types.extend((0..BUCKETS).map(|k| ValueType::new(&format!("{SIZE_BUCKET}{k}"), "count")));
    types.extend((0..BUCKETS).map(|k| ValueType::new(&format!("{LIFETIME_BUCKET}{k}"), "count")));
    types
}

/// What the flamegraph of a heap profile weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Metric {
    /// Allocations.
    Allocs,
    /// Bytes allocated.
    Bytes,
    /// Blocks still live at the end.
    LeakedBlocks,
    /// Bytes still live at the end.
    LeakedBytes,
    /// Bytes live when the process's live bytes peaked.
    PeakBytes,
    /// Blocks freed soon after their allocation (--temporary-ms).
    Temporaries,
}

impl Metric {
    /// Every metric, in the order of their value types.
    pub const ALL: [Metric; 6] = [
        Metric::Allocs,
        Metric::Bytes,
        Metric::LeakedBlocks,
        Metric::LeakedBytes,
        Metric::Temporaries,
        Metric::PeakBytes,
    ];

    /// The metric that weighs by value type `kind`, if one does.
    pub fn of_kind(kind: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.value_kind() == kind)
    }

    /// The value type it weighs by.
    pub fn value_kind(self) -> &'static str {
        match self {
            Metric::Allocs => ALLOCS,
            Metric::Bytes => ALLOC_SPACE,
            Metric::LeakedBlocks => LEAKED_BLOCKS,
            Metric::LeakedBytes => LEAKED_BYTES,
            Metric::PeakBytes => PEAK_BYTES,
            Metric::Temporaries => TEMPORARIES,
        }
    }

    /// How titles name it.
    pub fn describe(self) -> &'static str {
        match self {
            Metric::Allocs => "allocations",
            Metric::Bytes => "bytes allocated",
            Metric::LeakedBlocks => "blocks leaked",
            Metric::LeakedBytes => "bytes leaked",
            Metric::PeakBytes => "bytes live at the peak",
            Metric::Temporaries => "temporary allocations",
        }
    }
}

/// How the text report orders its stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OrderBy {
    /// Allocations.
    Count,
    /// Bytes allocated.
    #[default]
    Bytes,
    /// Bytes leaked.
    Leaked,
}

impl OrderBy {
    pub fn value_kind(self) -> &'static str {
        match self {
            OrderBy::Count => ALLOCS,
            OrderBy::Bytes => ALLOC_SPACE,
            OrderBy::Leaked => LEAKED_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_a_value_type() {
        let kinds: Vec<String> = value_types().into_iter().map(|t| t.kind).collect();
        for metric in Metric::ALL {
            assert!(kinds.iter().any(|k| k == metric.value_kind()), "{metric:?}");
            assert_eq!(Metric::of_kind(metric.value_kind()), Some(metric));
        }
        assert_eq!(kinds.len(), COUNTERS.len() + 2 * BUCKETS);
        assert!(kinds.iter().all(|kind| is_heap_value(kind)));
        assert!(!is_heap_value("samples") && !is_heap_value("cpu"));
    }
}
