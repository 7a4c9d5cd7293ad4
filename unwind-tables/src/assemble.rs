//! Turns the evaluated FDEs of `.eh_frame` and `.debug_frame` into the sorted rows of one
//! table: overlaps resolved, clipped to code, gaps made explicit, equal neighbours merged.
//!
//! Overlap policy (overlapping or duplicate FDEs occur in hand-written assembly and in
//! objects linked from inconsistent inputs): within one section, an address belongs to the
//! FDE that starts first, and among FDEs starting at the same address to the longest, then
//! to the one that comes first in the section. A later FDE keeps only the part that extends
//! past everything before it. Between sections, `.eh_frame` always wins: it is what the
//! runtime's own unwinder uses, so it is the CFI the program is known to work with;
//! `.debug_frame` only fills addresses no `.eh_frame` FDE covers.

use std::cmp::Reverse;
use std::ops::Range;

use crate::cfi::{Collected, Piece};
use crate::rule::Rule;

/// How many FDEs the resolution set aside.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Discarded {
    /// FDEs entirely outside the executable ranges.
    pub outside_code: u64,
    /// FDEs entirely covered by FDEs that win under the overlap policy.
    pub shadowed: u64,
}

/// One section's FDEs as sorted, disjoint pieces inside `code`, by the overlap policy.
pub(crate) fn resolve(
    collected: &Collected,
    code: &[Range<u64>],
    discarded: &mut Discarded,
) -> Vec<Piece> {
    let mut order: Vec<usize> = (0..collected.fdes.len()).collect();
    // Stable: equal (start, end) keep section order, so the first duplicate wins.
    order.sort_by_key(|&index| {
        let fde = &collected.fdes[index];
        (fde.start, Reverse(fde.end))
    });

    let mut out: Vec<Piece> = Vec::with_capacity(collected.pieces.len());
    let mut covered_until = 0u64;
    for index in order {
        let fde = &collected.fdes[index];
        if fde.end <= covered_until {
            discarded.shadowed += 1;
            continue;
        }
        let Some(code) = code_range_for(code, fde.start..fde.end) else {
            discarded.outside_code += 1;
            covered_until = covered_until.max(fde.end);
            continue;
        };
        let from = fde.start.max(covered_until).max(code.start);
        let to = fde.end.min(code.end);
        covered_until = covered_until.max(fde.end);
        for piece in &collected.pieces[fde.pieces.clone()] {
            let start = piece.start.max(from);
            let end = piece.end.min(to);
            if start < end {
                push_merged(
                    &mut out,
                    Piece {
                        start,
                        end,
                        rule: piece.rule,
                    },
                );
            }
        }
    }
    out
}

/// The executable range an FDE's code lies in: the one containing its start, else the first
/// one starting inside it. An FDE straddling two executable segments (never seen in real
/// objects) keeps only its part in the first; the rest is a gap, which is safe.
fn code_range_for(code: &[Range<u64>], fde: Range<u64>) -> Option<Range<u64>> {
    let next = code.partition_point(|range| range.end <= fde.start);
    let range = code.get(next)?;
    (range.start < fde.end).then(|| range.clone())
}

fn push_merged(out: &mut Vec<Piece>, piece: Piece) {
    if let Some(last) = out.last_mut() {
        if last.end == piece.start && last.rule == piece.rule {
            last.end = piece.end;
            return;
        }
    }
    out.push(piece);
}

/// `primary` plus the parts of `secondary` in addresses `primary` does not cover. Both are
/// sorted and disjoint; so is the result.
pub(crate) fn fill_gaps(primary: Vec<Piece>, secondary: &[Piece]) -> Vec<Piece> {
    if secondary.is_empty() {
        return primary;
    }
    let mut fill = Vec::new();
    let mut next_primary = 0;
    for piece in secondary {
        let mut start = piece.start;
        while start < piece.end {
            while next_primary < primary.len() && primary[next_primary].end <= start {
                next_primary += 1;
            }
            match primary.get(next_primary) {
                Some(covering) if covering.start <= start => start = covering.end,
                Some(following) => {
                    let end = piece.end.min(following.start);
                    fill.push(Piece {
                        start,
                        end,
                        rule: piece.rule,
                    });
                    start = end;
                }
                None => {
                    fill.push(Piece {
                        start,
                        end: piece.end,
                        rule: piece.rule,
                    });
                    start = piece.end;
                }
            }
        }
    }
    let mut all = primary;
    all.extend(fill);
    all.sort_unstable_by_key(|piece| piece.start);
    let mut merged = Vec::with_capacity(all.len());
    for piece in all {
        push_merged(&mut merged, piece);
    }
    merged
}

/// `pieces` with the ELF entry point covered: a process's first instruction starts its
/// outermost frame, so where no CFI covers the entry (ld.so's hand-written `_start`, whose
/// calls to `_dl_start` and `_dl_init` return into it), the code from the entry up to the
/// next piece or the end of its code range gets [`Rule::End`]. Walks through the dynamic
/// loader's start then end complete, as they do through a program's own `_start`.
pub(crate) fn cover_entry(mut pieces: Vec<Piece>, entry: u64, code: &[Range<u64>]) -> Vec<Piece> {
    let Some(range) = code.iter().find(|range| range.contains(&entry)) else {
        return pieces;
    };
    let next = pieces.partition_point(|piece| piece.end <= entry);
    let end = match pieces.get(next) {
        Some(piece) if piece.start <= entry => return pieces,
        Some(piece) => piece.start.min(range.end),
        None => range.end,
    };
    pieces.insert(
        next,
        Piece {
            start: entry,
            end,
            rule: Rule::End,
        },
    );
    pieces
}

/// Rows (start address, rule) for sorted, disjoint pieces: a `Gap` row wherever a piece ends
/// and the next does not start there (and after the last), consecutive equal rules merged.
pub(crate) fn to_rows(pieces: &[Piece]) -> Vec<(u64, Rule)> {
    let mut rows: Vec<(u64, Rule)> = Vec::with_capacity(pieces.len() + pieces.len() / 2);
    let push = |rows: &mut Vec<(u64, Rule)>, address: u64, rule: Rule| {
        if rows.last().is_some_and(|&(_, last)| last == rule) {
            return;
        }
        rows.push((address, rule));
    };
    let mut previous_end = None;
    for piece in pieces {
        if let Some(end) = previous_end {
            if end < piece.start {
                push(&mut rows, end, Rule::Gap);
            }
        }
        push(&mut rows, piece.start, piece.rule);
        previous_end = Some(piece.end);
    }
    if let Some(end) = previous_end {
        push(&mut rows, end, Rule::Gap);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cfi::FdeSpan;
    use crate::rule::{Cfa, RbpRule, UnsupportedReason};

    fn frame(offset: i32) -> Rule {
        Rule::Frame {
            cfa: Cfa::Rsp(offset),
            rbp: RbpRule::Same,
        }
    }

    /// (start, end, rule) of a piece.
    type Run = (u64, u64, Rule);

    fn collected(fdes: &[(u64, u64, &[Run])]) -> Collected {
        let mut out = Collected::default();
        for &(start, end, pieces) in fdes {
            let first = out.pieces.len();
            for &(start, end, rule) in pieces {
                out.pieces.push(Piece { start, end, rule });
            }
            out.fdes.push(FdeSpan {
                start,
                end,
                pieces: first..out.pieces.len(),
            });
        }
        out
    }

    fn ranges(pieces: &[Piece]) -> Vec<Run> {
        pieces.iter().map(|p| (p.start, p.end, p.rule)).collect()
    }

    #[test]
    fn earlier_then_longer_fde_wins_overlaps() {
        let input = collected(&[
            (20, 30, &[(20, 30, frame(16))]),
            (10, 25, &[(10, 25, frame(8))]),
            // Same start as the first, shorter: shadowed.
            (20, 22, &[(20, 22, frame(24))]),
            // Duplicate of the second: the first in section order wins.
            (10, 25, &[(10, 25, frame(32))]),
        ]);
        let mut discarded = Discarded::default();
        let pieces = resolve(&input, &[Range { start: 0, end: 100 }], &mut discarded);
        assert_eq!(
            ranges(&pieces),
            vec![(10, 25, frame(8)), (25, 30, frame(16))]
        );
        assert_eq!(discarded.shadowed, 2);
    }

    #[test]
    fn fdes_are_clipped_to_code() {
        let input = collected(&[
            (0, 8, &[(0, 8, frame(8))]),
            (90, 110, &[(90, 100, frame(8)), (100, 110, frame(16))]),
        ]);
        let mut discarded = Discarded::default();
        let pieces = resolve(
            &input,
            &[Range {
                start: 50,
                end: 105,
            }],
            &mut discarded,
        );
        assert_eq!(
            ranges(&pieces),
            vec![(90, 100, frame(8)), (100, 105, frame(16))]
        );
        assert_eq!(discarded.outside_code, 1);
    }

    #[test]
    fn debug_frame_fills_only_gaps() {
        let primary = vec![
            Piece {
                start: 10,
                end: 20,
                rule: frame(8),
            },
            Piece {
                start: 30,
                end: 40,
                rule: frame(8),
            },
        ];
        let secondary = [Piece {
            start: 0,
            end: 50,
            rule: frame(16),
        }];
        let merged = fill_gaps(primary, &secondary);
        assert_eq!(
            ranges(&merged),
            vec![
                (0, 10, frame(16)),
                (10, 20, frame(8)),
                (20, 30, frame(16)),
                (30, 40, frame(8)),
                (40, 50, frame(16)),
            ]
        );
    }

    #[test]
    fn rows_have_explicit_gaps_and_no_repeats() {
        let bad = Rule::Unsupported(UnsupportedReason::BadCfi);
        let pieces = [
            Piece {
                start: 10,
                end: 20,
                rule: frame(8),
            },
            Piece {
                start: 20,
                end: 30,
                rule: frame(8),
            },
            Piece {
                start: 30,
                end: 31,
                rule: bad,
            },
            Piece {
                start: 40,
                end: 50,
                rule: frame(8),
            },
        ];
        assert_eq!(
            to_rows(&pieces),
            vec![
                (10, frame(8)),
                (30, bad),
                (31, Rule::Gap),
                (40, frame(8)),
                (50, Rule::Gap)
            ]
        );
    }

    #[test]
    fn an_uncovered_entry_point_starts_an_end_of_stack_range() {
        let piece = |start, end, rule| Piece { start, end, rule };
        let code = &[0x1000..0x3000, 0x5000..0x6000];
        let pieces = vec![
            piece(0x1000, 0x1100, frame(8)),
            piece(0x1200, 0x1300, frame(16)),
        ];
        // In a gap: End up to the next piece.
        assert_eq!(
            cover_entry(pieces.clone(), 0x1180, code),
            vec![
                piece(0x1000, 0x1100, frame(8)),
                piece(0x1180, 0x1200, Rule::End),
                piece(0x1200, 0x1300, frame(16)),
            ]
        );
        // After the last piece: End up to the end of the code.
        assert_eq!(
            cover_entry(pieces.clone(), 0x2000, code)[2],
            piece(0x2000, 0x3000, Rule::End)
        );
        assert_eq!(
            cover_entry(pieces.clone(), 0x5800, code)[2],
            piece(0x5800, 0x6000, Rule::End)
        );
        // Covered by CFI, or outside the code: unchanged.
        assert_eq!(cover_entry(pieces.clone(), 0x1250, code), pieces);
        assert_eq!(cover_entry(pieces.clone(), 0x1200, code), pieces);
        assert_eq!(cover_entry(pieces.clone(), 0x4000, code), pieces);
    }
}
