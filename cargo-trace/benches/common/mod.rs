//! What the benchmarks of this crate share: how they summarize rounds, and how they read
//! a process's memory.

#![allow(dead_code)] // each benchmark uses its own part of this module

/// The median of some rounds' figures, and their range.
#[derive(Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut sorted: Vec<f64> = values.into_iter().collect();
        assert!(!sorted.is_empty(), "no rounds");
        sorted.sort_by(f64::total_cmp);
        Spread {
            median: sorted[sorted.len() / 2],
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        }
    }

    /// For a function that keeps the order of values (a unit's change).
    pub fn map(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread {
            median: f(self.median),
            min: f(self.min),
            max: f(self.max),
        }
    }

    /// `median [min–max]` with `decimals` decimals.
    pub fn show(self, decimals: usize) -> String {
        format!(
            "{:.*} [{:.*}–{:.*}]",
            decimals, self.median, decimals, self.min, decimals, self.max
        )
    }
}

/// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`), 0 if there is none.
pub fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
