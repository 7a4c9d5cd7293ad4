//! What a compilation produced and how much of the code it covers.

use std::fmt;

use crate::rule::{Rule, RuleKind};
use crate::table::CompactTable;

/// Rows and bytes governed by rules of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindCount {
    pub kind: RuleKind,
    /// Compact rows of this kind.
    pub rows: u64,
    /// Code bytes these rows govern (0 for gaps: a gap row governs no code with CFI).
    pub bytes: u64,
}

/// Figures of one compiled object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// FDEs read from `.eh_frame`.
    pub eh_frame_fdes: u64,
    /// FDEs read from `.debug_frame` (the file's own or a separate debug file's).
    pub debug_frame_fdes: u64,
    /// FDEs skipped because their header did not parse (their range is unknown).
    pub unparsable_fdes: u64,
    /// FDEs describing no executable address (typically discarded code, tombstoned at 0).
    pub outside_code_fdes: u64,
    /// FDEs entirely covered by other FDEs under the overlap policy (see `assemble`).
    pub shadowed_fdes: u64,
    /// Whether `.debug_frame` came from a separate debug file.
    pub separate_debug_file: bool,
    /// Rows of gimli's evaluation (before reduction and merging).
    pub cfi_rows: u64,
    /// Compact rows, gap rows included.
    pub rows: u64,
    /// Distinct rules.
    pub rules: u64,
    /// 64 KiB pages the table spans.
    pub pages: u64,
    /// Bytes the kernel holds for the table ([`CompactTable::kernel_bytes`]).
    pub kernel_bytes: u64,
    /// Code bytes some CFI describes.
    pub code_bytes_with_cfi: u64,
    /// Code bytes governed by a rule the walker executes (`Frame`, `End`, `Signal`).
    pub code_bytes_supported: u64,
    /// Rows and bytes per rule kind, in [`RuleKind`] order; kinds that do not occur are
    /// absent.
    pub kinds: Vec<KindCount>,
}

impl Stats {
    /// All FDEs read.
    pub fn fdes(&self) -> u64 {
        self.eh_frame_fdes + self.debug_frame_fdes
    }

    /// Kernel bytes per compact row: the compactness figure.
    pub fn bytes_per_row(&self) -> f64 {
        if self.rows == 0 {
            return 0.0;
        }
        self.kernel_bytes as f64 / self.rows as f64
    }

    /// Share of the code with CFI that the walker can unwind through, in [0, 1].
    pub fn supported_share(&self) -> f64 {
        if self.code_bytes_with_cfi == 0 {
            return 0.0;
        }
        self.code_bytes_supported as f64 / self.code_bytes_with_cfi as f64
    }

    /// Rows and bytes of `kind` (zero if absent).
    pub fn kind(&self, kind: RuleKind) -> KindCount {
        self.kinds
            .iter()
            .copied()
            .find(|count| count.kind == kind)
            .unwrap_or(KindCount {
                kind,
                rows: 0,
                bytes: 0,
            })
    }

    /// Fills the table-derived fields from `table`.
    pub(crate) fn measure_table(&mut self, table: &CompactTable) {
        self.rows = table.rows.len() as u64;
        self.rules = table.rules.len() as u64;
        self.pages = table.pages.len() as u64;
        self.kernel_bytes = table.kernel_bytes() as u64;
        self.code_bytes_with_cfi = 0;
        self.code_bytes_supported = 0;
        let mut kinds: Vec<KindCount> = Vec::new();
        let mut rows = table.iter().peekable();
        while let Some((start, rule)) = rows.next() {
            // The last row is always a gap; the bytes of a row run to the next row.
            let bytes = match (rule, rows.peek()) {
                (Rule::Gap, _) | (_, None) => 0,
                (_, Some(&(next, _))) => next - start,
            };
            if rule != Rule::Gap {
                self.code_bytes_with_cfi += bytes;
            }
            if rule.is_supported() {
                self.code_bytes_supported += bytes;
            }
            let kind = rule.kind();
            match kinds.binary_search_by_key(&kind, |count| count.kind) {
                Ok(index) => {
                    kinds[index].rows += 1;
                    kinds[index].bytes += bytes;
                }
                Err(index) => kinds.insert(
                    index,
                    KindCount {
                        kind,
                        rows: 1,
                        bytes,
                    },
                ),
            }
        }
        self.kinds = kinds;
    }
}

impl fmt::Display for Stats {
    /// One line: the figures a person checks first, then the kinds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} FDEs, {} rows ({:.2} B/row), {} rules, {:.3}% of {} code bytes supported",
            self.fdes(),
            self.rows,
            self.bytes_per_row(),
            self.rules,
            self.supported_share() * 100.0,
            self.code_bytes_with_cfi,
        )?;
        let mut separator = "; ";
        for count in &self.kinds {
            write!(f, "{separator}{} {}", count.kind.name(), count.rows)?;
            separator = ", ";
        }
        Ok(())
    }
}
