//! The compact table: 4-byte rows grouped in 64 KiB pages, plus a table of
//! distinct rules.
//!
//! A row holds the low 16 bits of its start address and a rule index. The page
//! of an address (`(pc >> 16) - first_page`) gives the slice of rows starting
//! inside that page; a binary search on the low bits finds the last row at or
//! before `pc`. When no row of the page starts at or before `pc`, the row just
//! before the page's slice governs (it started in an earlier page). This is the
//! exact lookup the BPF program does; [`CompactTable::lookup`] is its twin.

use crate::rule::Rule;

/// log2 of the page size that splits row addresses into page index + low bits.
pub const PAGE_SHIFT: u32 = 16;

/// One row: low 16 bits of the start address and an index into [`CompactTable::rules`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactRow {
    pub addr_lo: u16,
    pub rule: u16,
}

/// The rows starting inside one 64 KiB page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PageSpan {
    /// Index into [`CompactTable::rows`] of the first row starting in this page.
    pub first_row: u32,
    /// Number of rows starting in this page.
    pub nrows: u32,
}

/// The unwind table of one ELF object, addressed by ELF virtual address.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CompactTable {
    /// Lowest `address >> PAGE_SHIFT` the table covers; `pages[0]` is that page.
    pub first_page: u64,
    pub pages: Vec<PageSpan>,
    /// Sorted by address; consecutive rows never share a rule.
    pub rows: Vec<CompactRow>,
    /// Distinct rules; at most `u16::MAX + 1`.
    pub rules: Vec<Rule>,
}

impl CompactTable {
    /// Full start address of row `index`.
    pub fn row_address(&self, index: usize) -> u64 {
        // The page of a row is the one whose span contains it.
        let page = self
            .pages
            .partition_point(|span| (span.first_row as usize + span.nrows as usize) <= index);
        ((self.first_page + page as u64) << PAGE_SHIFT) | u64::from(self.rows[index].addr_lo)
    }

    /// Index of the row that governs ELF virtual address `pc`, as the BPF program finds it.
    pub fn lookup_row(&self, pc: u64) -> Option<usize> {
        let page = (pc >> PAGE_SHIFT).checked_sub(self.first_page)?;
        let span = *self.pages.get(usize::try_from(page).ok()?)?;
        let lo = (pc & 0xffff) as u16;
        let rows = &self.rows[span.first_row as usize..(span.first_row + span.nrows) as usize];
        let within = rows.partition_point(|row| row.addr_lo <= lo);
        if within > 0 {
            Some(span.first_row as usize + within - 1)
        } else {
            (span.first_row as usize).checked_sub(1)
        }
    }

    /// The rule that governs ELF virtual address `pc`; [`Rule::Gap`] outside the table.
    pub fn lookup(&self, pc: u64) -> Rule {
        match self.lookup_row(pc) {
            Some(index) => self.rules[usize::from(self.rows[index].rule)],
            None => Rule::Gap,
        }
    }

    /// Bytes the kernel holds for this table: 4 per row, 8 per page, 16 per rule.
    pub fn kernel_bytes(&self) -> usize {
        self.rows.len() * 4 + self.pages.len() * 8 + self.rules.len() * 16
    }
}
