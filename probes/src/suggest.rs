//! "Did you mean" suggestions for misspelt names.

/// Edit distance counting insertions, deletions, substitutions and swaps of adjacent
/// characters (optimal string alignment), or `None` when it exceeds `limit`.
pub(crate) fn edit_distance(a: &str, b: &str, limit: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Names of very different lengths, most of a large symbol table, are rejected cheaply.
    if a.len().abs_diff(b.len()) > limit {
        return None;
    }
    let width = b.len() + 1;
    let mut before: Vec<usize> = vec![0; width];
    let mut previous: Vec<usize> = (0..width).collect();
    let mut current = vec![0; width];
    for i in 0..a.len() {
        current[0] = i + 1;
        let mut row_min = current[0];
        for j in 0..b.len() {
            let mut d = (previous[j] + usize::from(a[i] != b[j]))
                .min(previous[j + 1] + 1)
                .min(current[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                d = d.min(before[j - 1] + 1);
            }
            current[j + 1] = d;
            row_min = row_min.min(d);
        }
        if row_min > limit {
            return None;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    Some(previous[b.len()]).filter(|&d| d <= limit)
}

/// How far apart two names may be and still count as a typo of each other.
pub(crate) fn typo_limit(name: &str) -> usize {
    (name.chars().count() / 4).clamp(1, 3)
}

/// The candidate closest to `name` within typo distance, if any.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = typo_limit(name);
    candidates
        .filter_map(|c| edit_distance(name, c, limit).map(|d| (d, c)))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("uprobe", "uprobe", 3), Some(0));
        assert_eq!(edit_distance("uprobes", "uprobe", 3), Some(1));
        assert_eq!(edit_distance("kitten", "sitting", 3), Some(3));
        assert_eq!(edit_distance("kitten", "sitting", 2), None);
        assert_eq!(edit_distance("a", "abcdef", 2), None);
        assert_eq!(edit_distance("profiel", "profile", 3), Some(1));
        assert_eq!(edit_distance("", "ab", 3), Some(2));
    }

    #[test]
    fn closest_picks_the_nearest_typo() {
        let names = ["uprobe", "uretprobe", "usdt", "profile"];
        assert_eq!(closest("uprobes", names.iter().copied()), Some("uprobe"));
        assert_eq!(closest("profiel", names.iter().copied()), Some("profile"));
        assert_eq!(closest("zzzzzz", names.iter().copied()), None);
    }
}
