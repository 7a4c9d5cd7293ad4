//! The compact table: 4-byte rows grouped in 64 KiB pages, plus a table of
//! distinct rules.
//!
//! A row holds the low 16 bits of its start address and a rule index. The page
//! of an address (`(pc >> 16) - first_page`) gives the slice of rows starting
//! inside that page; a binary search on the low bits finds the last row at or
//! before `pc`. When no row of the page starts at or before `pc`, the row just
//! before the page's slice governs (it started in an earlier page). This is the
//! exact lookup the BPF program does; [`CompactTable::lookup_in_row`] is its twin.
//!
//! A [`Cfa::RspSteps`] rule also needs how far the pc lies past its row's start. The
//! search knows it when the row starts in the pc's page (the difference of the low bits);
//! a row from an earlier page is taken to be [`STEP_WINDOW`] or more bytes behind, which
//! [`CompactTable::check`] makes true: every step of such a row lies in the row's own page.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::Error;
use crate::rule::{Cfa, Rule, STEP_WINDOW};

/// log2 of the page size that splits row addresses into page index + low bits.
pub const PAGE_SHIFT: u32 = 16;

/// Most distinct rules a table can hold: a row names its rule with 16 bits.
pub const MAX_RULES: usize = 1 << 16;

/// Most pages a table may span (4 GiB of address space). Pages without rows still cost
/// 8 bytes each, so an ELF with CFI at wildly distant addresses (corrupt, or crafted) must
/// not make us allocate gigabytes; no real object has 4 GiB between its first and last
/// function.
pub const MAX_PAGES: u64 = 1 << 16;

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
        self.find(pc).map(|(index, _)| index)
    }

    /// The row governing `pc` and `pc`'s offset past the row's start, capped at
    /// [`STEP_WINDOW`] (a row from an earlier page counts as that far behind).
    fn find(&self, pc: u64) -> Option<(usize, u32)> {
        let page = (pc >> PAGE_SHIFT).checked_sub(self.first_page)?;
        let span = *self.pages.get(usize::try_from(page).ok()?)?;
        let lo = (pc & 0xffff) as u16;
        let rows = &self.rows[span.first_row as usize..(span.first_row + span.nrows) as usize];
        let within = rows.partition_point(|row| row.addr_lo <= lo);
        if within > 0 {
            let offset = u32::from(lo - rows[within - 1].addr_lo).min(STEP_WINDOW);
            Some((span.first_row as usize + within - 1, offset))
        } else {
            Some(((span.first_row as usize).checked_sub(1)?, STEP_WINDOW))
        }
    }

    /// What the walkers execute at ELF virtual address `pc`: the rule of its row as stored
    /// (possibly [`Cfa::RspSteps`]) and `pc`'s offset past the row's start, capped at
    /// [`STEP_WINDOW`]; `(Gap, 0)` outside the table.
    pub fn lookup_in_row(&self, pc: u64) -> (Rule, u32) {
        match self.find(pc) {
            Some((index, offset)) => (self.rules[usize::from(self.rows[index].rule)], offset),
            None => (Rule::Gap, 0),
        }
    }

    /// The rule in effect at ELF virtual address `pc`; [`Rule::Gap`] outside the table. A
    /// merged push/pop row is resolved to the plain rule at `pc` ([`Rule::at_row_offset`]),
    /// so this never returns [`Cfa::RspSteps`].
    pub fn lookup(&self, pc: u64) -> Rule {
        let (rule, offset) = self.lookup_in_row(pc);
        rule.at_row_offset(offset)
    }

    /// Every row as (start address, rule), in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Rule)> + '_ {
        self.pages.iter().enumerate().flat_map(move |(page, span)| {
            let base = (self.first_page + page as u64) << PAGE_SHIFT;
            let first = span.first_row as usize;
            let rows = self
                .rows
                .get(first..first + span.nrows as usize)
                .unwrap_or(&[]);
            rows.iter().map(move |row| {
                let rule = self.rules.get(usize::from(row.rule)).copied();
                (base | u64::from(row.addr_lo), rule.unwrap_or(Rule::Gap))
            })
        })
    }

    /// Checks every invariant the BPF lookup relies on: pages partition the rows in order,
    /// rows ascend within a page, rule indices are in range, consecutive rows differ, the
    /// steps of a [`Cfa::RspSteps`] row lie in the row's own page and its CFA offsets fit i32.
    /// Tables read from outside (the on-disk cache) go through this before use.
    pub fn check(&self) -> Result<(), InvalidTable> {
        if self.rules.len() > MAX_RULES {
            return Err(InvalidTable("more than 65536 rules"));
        }
        if self.pages.len() as u64 > MAX_PAGES {
            return Err(InvalidTable("too many pages"));
        }
        if self
            .first_page
            .checked_add(self.pages.len() as u64)
            .is_none_or(|end| end > (u64::MAX >> PAGE_SHIFT) + 1)
        {
            return Err(InvalidTable("pages extend past the address space"));
        }
        if self.rows.len() > u32::MAX as usize {
            return Err(InvalidTable("more than 2^32 rows"));
        }
        let mut next_row = 0usize;
        for span in &self.pages {
            if span.first_row as usize != next_row {
                return Err(InvalidTable("pages do not partition the rows in order"));
            }
            next_row += span.nrows as usize;
            let Some(rows) = self.rows.get(span.first_row as usize..next_row) else {
                return Err(InvalidTable("page points past the rows"));
            };
            if rows
                .windows(2)
                .any(|pair| pair[0].addr_lo >= pair[1].addr_lo)
            {
                return Err(InvalidTable("rows of a page are not in ascending order"));
            }
        }
        if next_row != self.rows.len() {
            return Err(InvalidTable("rows not covered by any page"));
        }
        if self
            .rows
            .iter()
            .any(|row| usize::from(row.rule) >= self.rules.len())
        {
            return Err(InvalidTable("row names a rule that does not exist"));
        }
        if self
            .rows
            .windows(2)
            .any(|pair| pair[0].rule == pair[1].rule)
        {
            return Err(InvalidTable("consecutive rows share a rule"));
        }
        for rule in &self.rules {
            if let Rule::Frame {
                cfa:
                    Cfa::RspSteps {
                        offset,
                        pushes,
                        pops,
                    },
                ..
            } = *rule
            {
                let lowest = i64::from(offset) - 8 * i64::from(pops.count_ones());
                let highest = i64::from(offset) + 8 * i64::from(pushes.count_ones());
                if i32::try_from(lowest).is_err() || i32::try_from(highest).is_err() {
                    return Err(InvalidTable("push/pop steps overflow the CFA offset"));
                }
            }
        }
        if self.rows.iter().any(|row| {
            // How far past the row's start its last step lies.
            let last_step = match self.rules[usize::from(row.rule)] {
                Rule::Frame {
                    cfa: Cfa::RspSteps { pushes, pops, .. },
                    ..
                } => u16::BITS - (pushes | pops).leading_zeros(),
                _ => 0,
            };
            u32::from(row.addr_lo) + last_step > 0xffff
        }) {
            return Err(InvalidTable("push/pop steps run into the next page"));
        }
        Ok(())
    }

    /// Builds a table from rows in strictly ascending address order, no two consecutive
    /// rows with the same rule (the compiler merges them before).
    pub(crate) fn from_sorted_rows(rows: &[(u64, Rule)]) -> Result<CompactTable, Error> {
        let (Some(&(first, _)), Some(&(last, _))) = (rows.first(), rows.last()) else {
            return Ok(CompactTable::default());
        };
        let first_page = first >> PAGE_SHIFT;
        let npages = (last >> PAGE_SHIFT) - first_page + 1;
        if npages > MAX_PAGES {
            return Err(Error::TableTooLarge {
                span: last - first,
                max: MAX_PAGES << PAGE_SHIFT,
            });
        }

        let mut rule_index: HashMap<Rule, u16, BuildHasherDefault<FxHasher>> = HashMap::default();
        let mut rules = Vec::new();
        let mut compact = Vec::with_capacity(rows.len());
        for &(addr, rule) in rows {
            let index = match rule_index.get(&rule) {
                Some(&index) => index,
                None => {
                    let index = u16::try_from(rules.len()).map_err(|_| Error::TooManyRules {
                        count: rules.len() + 1,
                    })?;
                    rules.push(rule);
                    rule_index.insert(rule, index);
                    index
                }
            };
            compact.push(CompactRow {
                addr_lo: (addr & 0xffff) as u16,
                rule: index,
            });
        }
        if compact.len() > u32::MAX as usize {
            // Unreachable for real input (each row costs at least one byte of CFI), but the
            // page spans are 32-bit.
            return Err(Error::TableTooLarge {
                span: last - first,
                max: MAX_PAGES << PAGE_SHIFT,
            });
        }

        let mut pages = Vec::with_capacity(npages as usize);
        let mut row = 0usize;
        for page in first_page..first_page + npages {
            let first_row = row;
            while row < rows.len() && rows[row].0 >> PAGE_SHIFT == page {
                row += 1;
            }
            pages.push(PageSpan {
                first_row: first_row as u32,
                nrows: (row - first_row) as u32,
            });
        }
        Ok(CompactTable {
            first_page,
            pages,
            rows: compact,
            rules,
        })
    }

    /// Bytes the kernel holds for this table: 4 per row, 8 per page, 16 per rule.
    pub fn kernel_bytes(&self) -> usize {
        self.rows.len() * 4 + self.pages.len() * 8 + self.rules.len() * 16
    }
}

/// A table that breaks an invariant of the layout (see [`CompactTable::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid unwind table: {0}")]
pub struct InvalidTable(pub &'static str);

/// The multiply-rotate hash of rustc's FxHasher. Rule deduplication hashes every row's rule;
/// std's SipHash (DoS-resistant, which nothing here needs: the keys are a few hundred rules)
/// was a tenth of the compile time.
#[derive(Default)]
struct FxHasher {
    hash: u64,
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_i32(&mut self, value: i32) {
        self.write_u64(value as u32 as u64);
    }

    fn write_isize(&mut self, value: isize) {
        self.write_u64(value as u64);
    }

    fn write_u64(&mut self, value: u64) {
        self.hash = (self.hash.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}
