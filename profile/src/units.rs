//! Figures as a person reads them: bytes in KiB/MiB, times in µs/ms/s, counts with
//! thousands separators. The HTML report's script formats its own figures the same way
//! (`writers/html/report.js`: `bytes`, `duration`, `count`).

use std::time::Duration;

/// `512 B`, `3.4 KiB`, `28.1 MiB`, `137 MiB`, `1.2 GiB`.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n.unsigned_abs() < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", significant(value), UNITS[unit])
}

/// A duration in nanoseconds: `850 ns`, `12.5 µs`, `3.4 ms`, `0.24 s`, `1.50 s`,
/// `12.3 s`, `2 min 5 s`.
pub fn nanoseconds(ns: i64) -> String {
    let abs = ns.unsigned_abs();
    if abs < 1_000 {
        format!("{ns} ns")
    } else if abs < 1_000_000 {
        format!("{} µs", significant(ns as f64 / 1e3))
    } else if abs < 1_000_000_000 {
        format!("{} ms", significant(ns as f64 / 1e6))
    } else if abs < 100_000_000_000 {
        let seconds = ns as f64 / 1e9;
        if seconds.abs() < 10.0 {
            format!("{seconds:.2} s")
        } else {
            format!("{seconds:.1} s")
        }
    } else {
        let seconds = abs / 1_000_000_000;
        let sign = if ns < 0 { "-" } else { "" };
        if seconds < 3_600 {
            format!("{sign}{} min {} s", seconds / 60, seconds % 60)
        } else {
            format!("{sign}{} h {} min", seconds / 3_600, seconds / 60 % 60)
        }
    }
}

/// A run's length: as [`nanoseconds`].
pub fn duration(duration: Duration) -> String {
    nanoseconds(i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX))
}

/// `2,519,608`.
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        grouped.push('-');
    }
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// `1 block`, `104 blocks`.
pub fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A value of unit `unit` (a pprof unit: `bytes`, `nanoseconds`, `microseconds`,
/// `count`, ...), in the form above that fits it.
pub fn value(n: i64, unit: &str) -> String {
    match unit {
        "bytes" => bytes(n),
        "nanoseconds" => nanoseconds(n),
        "microseconds" => nanoseconds(n.saturating_mul(1_000)),
        _ => count(n),
    }
}

/// Three significant figures at most, and one decimal at most: `3.4`, `28.1`, `137`.
fn significant(value: f64) -> String {
    if value.abs() < 100.0 {
        let text = format!("{value:.1}");
        text.strip_suffix(".0").map_or(text.clone(), str::to_string)
    } else {
        format!("{value:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1 KiB");
        assert_eq!(bytes(3_565_158), "3.4 MiB");
        assert_eq!(bytes(143_577_574), "137 MiB");
        assert_eq!(bytes(29_464_986), "28.1 MiB");
        assert_eq!(bytes(-2048), "-2 KiB");
        assert_eq!(bytes(5 << 30), "5 GiB");
    }

    #[test]
    fn times_in_the_unit_that_fits() {
        assert_eq!(nanoseconds(850), "850 ns");
        assert_eq!(nanoseconds(12_500), "12.5 µs");
        assert_eq!(nanoseconds(3_400_000), "3.4 ms");
        assert_eq!(nanoseconds(240_000_000), "240 ms");
        assert_eq!(nanoseconds(1_500_000_000), "1.50 s");
        assert_eq!(nanoseconds(21_862_686_000), "21.9 s");
        assert_eq!(nanoseconds(125_000_000_000), "2 min 5 s");
        assert_eq!(nanoseconds(7_380_000_000_000), "2 h 3 min");
        assert_eq!(value(21_862_686, "microseconds"), "21.9 s");
    }

    #[test]
    fn counts_with_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(2_519_608), "2,519,608");
        assert_eq!(count(-1_234_567), "-1,234,567");
        assert_eq!(plural(1, "block", "blocks"), "1 block");
        assert_eq!(plural(1_040, "block", "blocks"), "1,040 blocks");
    }
}
