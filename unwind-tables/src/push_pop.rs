//! Push/pop merging: a run of rows that differ only by pushes and pops becomes one
//! [`Cfa::RspSteps`] row.
//!
//! Prologues and epilogues without a frame pointer describe every `push` and `pop` with its
//! own CFI row, `CFA = rsp + 8`, `+ 16`, `+ 24` …, each a byte or two long: about half of
//! all rows. The walker knows where a row starts, so one row can carry the whole run: its
//! rule keeps the first row's offset and a bit per later row, at that row's distance from
//! the start, saying whether rsp moved down 8 (a push) or up 8 (a pop) there.
//!
//! Rows `r0 … rn` (n ≥ 1) merge when all are `Frame { cfa: Rsp(o_i), rbp }` with one rbp
//! rule, `o_i − o_(i−1)` is ±8, and every `r_i` (i ≥ 1) starts 1..=[`STEP_WINDOW`] bytes
//! after `r0` and in `r0`'s 64 KiB page (so that a lookup from a later page, which does not
//! know the row's start, rightly sees every step). At any pc of the merged row the steps
//! at or before it are exactly the rows `r1 … ri` that started at or before it, so the rule
//! gives `o_i`: the merge is exact, and [`rsp_steps_offset`](crate::rule::rsp_steps_offset)
//! at each row start gives back the rows merged.

use crate::rule::{Cfa, RbpRule, Rule, STEP_WINDOW};
use crate::table::PAGE_SHIFT;

/// `rows` (sorted, consecutive rules distinct) with every run of push/pop rows merged;
/// consecutive rules stay distinct.
pub(crate) fn merge(rows: &[(u64, Rule)]) -> Vec<(u64, Rule)> {
    let mut out: Vec<(u64, Rule)> = Vec::with_capacity(rows.len());
    let mut index = 0;
    while index < rows.len() {
        let (start, rule) = rows[index];
        match run_from(&rows[index..]) {
            // A merged row equal to the one before it (possible only where the window or a
            // page boundary cut a run) cannot follow it: keep this row as it is and merge
            // from the next.
            Some((taken, merged)) if out.last().is_none_or(|&(_, last)| last != merged) => {
                out.push((start, merged));
                index += taken;
            }
            _ => {
                out.push((start, rule));
                index += 1;
            }
        }
    }
    out
}

/// The longest mergeable run at the start of `rows`, if it has at least two rows: how many
/// rows it takes and their merged rule.
fn run_from(rows: &[(u64, Rule)]) -> Option<(usize, Rule)> {
    let &(start, first) = rows.first()?;
    let Rule::Frame {
        cfa: Cfa::Rsp(offset),
        rbp,
    } = first
    else {
        return None;
    };
    let (mut pushes, mut pops) = (0u16, 0u16);
    let mut previous = offset;
    let mut taken = 1;
    for &(address, rule) in &rows[1..] {
        let Some(next) = rsp_offset_with(rule, rbp) else {
            break;
        };
        let distance = address - start;
        if distance > u64::from(STEP_WINDOW) || address >> PAGE_SHIFT != start >> PAGE_SHIFT {
            break;
        }
        let bit = 1u16 << (distance - 1);
        match i64::from(next) - i64::from(previous) {
            8 => pushes |= bit,
            -8 => pops |= bit,
            _ => break,
        }
        previous = next;
        taken += 1;
    }
    let merged = Rule::Frame {
        cfa: Cfa::RspSteps {
            offset,
            pushes,
            pops,
        },
        rbp,
    };
    (taken >= 2).then_some((taken, merged))
}

/// The rsp offset of `rule` if it is an rsp frame rule with rbp rule `rbp`.
fn rsp_offset_with(rule: Rule, rbp: RbpRule) -> Option<i32> {
    match rule {
        Rule::Frame {
            cfa: Cfa::Rsp(offset),
            rbp: other,
        } if other == rbp => Some(offset),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::CompactTable;

    fn rsp(offset: i32) -> Rule {
        Rule::Frame {
            cfa: Cfa::Rsp(offset),
            rbp: RbpRule::Same,
        }
    }

    fn steps(offset: i32, pushes: u16, pops: u16) -> Rule {
        Rule::Frame {
            cfa: Cfa::RspSteps {
                offset,
                pushes,
                pops,
            },
            rbp: RbpRule::Same,
        }
    }

    /// Merges `rows` and checks the result against them at every address they cover: the
    /// merged table's resolved rule is the unmerged one, byte for byte.
    fn merged_exactly(rows: &[(u64, Rule)]) -> Vec<(u64, Rule)> {
        let merged = merge(rows);
        let plain = CompactTable::from_sorted_rows(rows).unwrap();
        let table = CompactTable::from_sorted_rows(&merged).unwrap();
        table.check().expect("merged table invariants");
        let (first, last) = (rows[0].0, rows[rows.len() - 1].0);
        for pc in first - 1..=last {
            assert_eq!(table.lookup(pc), plain.lookup(pc), "pc {pc:#x}");
        }
        merged
    }

    #[test]
    fn prologue_and_epilogue_runs_become_one_row_each() {
        // push %r15; push %r14; push %rbx; sub $0x30,%rsp … add $0x30,%rsp; pop %rbx;
        // pop %r14; pop %r15; ret
        let rows = [
            (0x1000, rsp(8)),
            (0x1002, rsp(16)),
            (0x1004, rsp(24)),
            (0x1005, rsp(32)),
            (0x1009, rsp(80)),
            (0x1040, rsp(32)),
            (0x1041, rsp(24)),
            (0x1043, rsp(16)),
            (0x1045, rsp(8)),
            (0x1046, rsp(80)),
            (0x1050, Rule::Gap),
        ];
        assert_eq!(
            merged_exactly(&rows),
            vec![
                (0x1000, steps(8, 0b1_1010, 0)),
                (0x1009, rsp(80)),
                (0x1040, steps(32, 0, 0b1_0101)),
                (0x1046, rsp(80)),
                (0x1050, Rule::Gap),
            ]
        );
    }

    #[test]
    fn mixed_pushes_and_pops_merge() {
        let rows = [
            (0x1000, rsp(8)),
            (0x1001, rsp(16)),
            (0x1003, rsp(8)),
            (0x1004, rsp(16)),
            (0x1010, Rule::Gap),
        ];
        assert_eq!(
            merged_exactly(&rows),
            vec![(0x1000, steps(8, 0b1001, 0b100)), (0x1010, Rule::Gap)]
        );
    }

    #[test]
    fn runs_end_at_other_steps_rbp_changes_the_window_and_the_page() {
        let saved = Rule::Frame {
            cfa: Cfa::Rsp(24),
            rbp: RbpRule::AtCfa(-24),
        };
        let rows = [
            // +16 is not a push.
            (0x1000, rsp(8)),
            (0x1001, rsp(24)),
            // The rbp rule changes with this push.
            (0x1002, saved),
            (0x1003, rsp(32)),
            // Steps at 1..=16 bytes only: the push at +17 starts a new run.
            (0x1100, rsp(8)),
            (0x1110, rsp(16)),
            (0x1111, rsp(24)),
            (0x1112, rsp(32)),
            // Not across a page: the push at 0x2_0000 starts a new run.
            (0x1_fffe, rsp(8)),
            (0x1_ffff, rsp(16)),
            (0x2_0000, rsp(24)),
            (0x2_0001, rsp(32)),
            (0x2_0100, Rule::Gap),
        ];
        assert_eq!(
            merged_exactly(&rows),
            vec![
                (0x1000, rsp(8)),
                (0x1001, rsp(24)),
                (0x1002, saved),
                (0x1003, rsp(32)),
                (0x1100, steps(8, 1 << 15, 0)),
                (0x1111, steps(24, 1, 0)),
                (0x1_fffe, steps(8, 1, 0)),
                (0x2_0000, steps(24, 1, 0)),
                (0x2_0100, Rule::Gap),
            ]
        );
    }

    #[test]
    fn a_merged_row_never_repeats_the_one_before() {
        // Two identical runs, the second one byte past the first's window.
        let rows = [
            (0x1000, rsp(8)),
            (0x1001, rsp(16)),
            (0x1011, rsp(8)),
            (0x1012, rsp(16)),
            (0x1020, Rule::Gap),
        ];
        assert_eq!(
            merged_exactly(&rows),
            vec![
                (0x1000, steps(8, 1, 0)),
                (0x1011, rsp(8)),
                (0x1012, rsp(16)),
                (0x1020, Rule::Gap),
            ]
        );
    }

    #[test]
    fn a_row_from_an_earlier_page_has_taken_every_step() {
        // The last pushed row runs on through page 2 (which has no row) into page 3.
        let rows = [
            (0x1_fff0, rsp(8)),
            (0x1_fff1, rsp(16)),
            (0x1_fff3, rsp(24)),
            (0x3_0010, Rule::Gap),
        ];
        let merged = merged_exactly(&rows);
        assert_eq!(merged[0], (0x1_fff0, steps(8, 0b101, 0)));
        let table = CompactTable::from_sorted_rows(&merged).unwrap();
        for pc in [0x2_0000, 0x2_0001, 0x3_0000, 0x3_000f] {
            assert_eq!(table.lookup_in_row(pc), (merged[0].1, STEP_WINDOW));
            assert_eq!(table.lookup(pc), rsp(24), "pc {pc:#x}");
        }
        assert_eq!(table.lookup_in_row(0x1_fff2), (merged[0].1, 2));
    }

    #[test]
    fn check_rejects_steps_past_the_page_or_the_offset_range() {
        let table =
            |rule| CompactTable::from_sorted_rows(&[(0x1_fff8, rule), (0x2_0010, Rule::Gap)]);
        assert!(table(steps(8, 1 << 6, 0)).unwrap().check().is_ok()); // step at 0x1_ffff
        assert!(table(steps(8, 1 << 7, 0)).unwrap().check().is_err()); // step at 0x2_0000
        assert!(table(steps(8, 0, 1 << 7)).unwrap().check().is_err());
        assert!(table(steps(i32::MAX - 8, 1, 0)).unwrap().check().is_ok());
        assert!(table(steps(i32::MAX - 8, 3, 0)).unwrap().check().is_err());
        assert!(table(steps(i32::MIN + 8, 0, 3)).unwrap().check().is_err());
    }
}
