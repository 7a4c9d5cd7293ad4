//! `*` patterns, as bpftrace matches probe names.
//!
//! Only `*` is special: `?` and `[...]` appear literally in C++ and Rust names
//! (`operator[]`, `<[T]>::len`).

/// Whether `text` is a pattern rather than a name.
pub(crate) fn has_wildcard(text: &str) -> bool {
    text.contains('*')
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters
/// (including `*` itself).
pub(crate) fn matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // Position of the last `*` seen and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star_pi, star_ti)) = star {
            // Let the last `*` swallow one more character and retry.
            pi = star_pi + 1;
            ti = star_ti + 1;
            star = Some((star_pi, star_ti + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_any_run() {
        assert!(matches("*", ""));
        assert!(matches("*", "anything"));
        assert!(matches("sched_*", "sched_switch"));
        assert!(matches("*switch", "sched_switch"));
        assert!(matches("s*d*h", "sched_switch"));
        assert!(matches("myprog::*::parse", "myprog::a::b::parse"));
        assert!(!matches("sched_*", "irq_handler"));
        assert!(!matches("a*b", "acd"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
        assert!(matches(
            "<*const T as *>::fmt",
            "<*const T as core::fmt::Debug>::fmt"
        ));
    }
}
