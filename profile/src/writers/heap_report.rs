//! The heap profile's text report: totals, the top stacks with their size histograms
//! drawn as bars (as jeprofl draws them), and the top leaks with their mean age.
//!
//! It reads the heap value types of the samples (see `crate::heap::value_types`) and
//! the profile's [`HeapTotals`](crate::HeapTotals); a profile without them says
//! so in one line.

use std::io::{self, Write};

use crate::heap::BUCKETS as ALLOC_BUCKETS;
use crate::heap::{self as alloc, OrderBy};
use crate::{Profile, Sample};

/// Stacks listed in each top list.
const TOP: usize = 10;
/// Frames of a stack shown (repeats folded into one).
const FRAMES_SHOWN: usize = 12;
/// Processes (or executables) listed with their allocators.
const ALLOCATOR_LINES: usize = 20;
/// Width of a histogram's longest bar.
const BAR_WIDTH: u64 = 40;

/// Writes the report of `profile`, its top stacks ordered by `order_by`.
pub fn write(profile: &Profile, order_by: OrderBy, out: &mut dyn Write) -> io::Result<()> {
    let Some(heap) = &profile.heap else {
        return writeln!(
            out,
            "cargo-trace: no heap profile (trace with the alloc probe)"
        );
    };
    let value = |sample: &Sample, kind: &str| -> i64 {
        profile
            .value_index(kind)
            .map_or(0, |index| sample.values[index])
    };
    let sums = profile.heap_sums().unwrap_or_default();

    writeln!(out, "== heap profile ==")?;
    if let Some(sampling) = &heap.sampling {
        writeln!(out, "sampled: {sampling}")?;
    }
    if let Some(filter) = &heap.size_filter {
        writeln!(out, "counted: {filter} only")?;
    }
    writeln!(
        out,
        "allocations {} ({}), frees {} ({})",
        sums.allocs,
        bytes(sums.bytes as i64),
        sums.frees,
        bytes(sums.freed_bytes as i64),
    )?;
    writeln!(
        out,
        "peak {} live; leaked {} blocks ({}) at the end; temporaries {} (freed within {:?}); \
         unknown frees {}",
        bytes(sums.peak_bytes),
        sums.leaked_blocks,
        bytes(sums.leaked_bytes),
        sums.temporaries,
        heap.temporary_threshold,
        sums.unknown_frees,
    )?;
    if let Some(mapped) = heap.mapped.as_ref().filter(|m| m.total().maps > 0) {
        writeln!(
            out,
            "mapped memory (anonymous mmap, {}): {}",
            if mapped.counted {
                "counted as heap blocks too: --mmap"
            } else {
                "not counted as heap blocks, as heaptrack: --mmap counts it"
            },
            mapped.describe()
        )?;
    }
    allocators(heap, out)?;
    if heap.processes.len() > 1 {
        let merged = profile.summary.merged_processes;
        for p in &heap.processes {
            // Their peak is the highest of theirs (each process's peak, taken when it exited).
            let pid = if p.pid == crate::MERGED_PID && merged > 0 {
                format!("0 ({merged} exited processes together)")
            } else {
                p.pid.to_string()
            };
            writeln!(
                out,
                "  process {}: allocations {} ({}), frees {}, peak {}, leaked {}",
                pid,
                p.allocs,
                bytes(p.bytes as i64),
                p.frees,
                bytes(p.peak_bytes),
                bytes(p.live_bytes)
            )?;
        }
    }
    if let Some(rss) = heap.timeline.iter().map(|p| p.rss_bytes).max() {
        writeln!(
            out,
            "resident memory at most {} ({} timeline points, --timeline writes them)",
            bytes(rss as i64),
            heap.timeline.len()
        )?;
    }
    for lost in &heap.lost {
        writeln!(out, "note: {}: {}", lost.what, lost.count_and_options())?;
    }
    let untracked = profile
        .value_index(alloc::UNTRACKED)
        .is_some_and(|index| profile.total(index) > 0);
    if untracked {
        writeln!(
            out,
            "note: untracked blocks are counted as allocated, never as freed or leaked"
        )?;
    }

    let mut heap_samples: Vec<&Sample> = profile
        .samples
        .iter()
        .filter(|s| value(s, alloc::ALLOCS) > 0 || value(s, alloc::FREES) > 0)
        .collect();
    let order = order_by.value_kind();
    heap_samples.sort_by_key(|s| std::cmp::Reverse(value(s, order)));
    writeln!(
        out,
        "\n== top {TOP} stacks by {} ==",
        match order_by {
            OrderBy::Count => "allocations",
            OrderBy::Bytes => "bytes allocated",
            OrderBy::Leaked => "bytes leaked",
        }
    )?;
    let size_index = profile.value_index(&format!("{}0", alloc::SIZE_BUCKET));
    for (rank, sample) in heap_samples.iter().take(TOP).enumerate() {
        writeln!(
            out,
            "#{} {} allocations, {}, {} frees, {} leaked ({}), {} temporaries, pid {}",
            rank + 1,
            value(sample, alloc::ALLOCS),
            bytes(value(sample, alloc::ALLOC_SPACE)),
            value(sample, alloc::FREES),
            value(sample, alloc::LEAKED_BLOCKS),
            bytes(value(sample, alloc::LEAKED_BYTES)),
            value(sample, alloc::TEMPORARIES),
            sample.pid,
        )?;
        writeln!(out, "   at {}", describe_stack(profile, sample))?;
        if let Some(first) = size_index {
            histogram(out, &sample.values[first..first + ALLOC_BUCKETS])?;
        }
    }

    let mut leaks: Vec<&&Sample> = heap_samples
        .iter()
        .filter(|s| value(s, alloc::LEAKED_BLOCKS) > 0)
        .collect();
    leaks.sort_by_key(|s| std::cmp::Reverse(value(s, alloc::LEAKED_BYTES)));
    writeln!(out, "\n== top {TOP} leaks (live at the end) ==")?;
    if leaks.is_empty() {
        writeln!(out, "none")?;
    }
    for (rank, sample) in leaks.iter().take(TOP).enumerate() {
        let blocks = value(sample, alloc::LEAKED_BLOCKS);
        let mean_age_us = value(sample, alloc::LEAKED_AGE) / blocks.max(1);
        writeln!(
            out,
            "#{} {} blocks, {}, mean age {:.3} s, pid {}",
            rank + 1,
            blocks,
            bytes(value(sample, alloc::LEAKED_BYTES)),
            mean_age_us as f64 / 1e6,
            sample.pid,
        )?;
        writeln!(out, "   at {}", describe_stack(profile, sample))?;
    }
    Ok(())
}

/// Which allocators were counted: one line where every process counted the same, else
/// a line per process (or executable, for processes counted together), and a note for
/// each process that missed some of its heap.
fn allocators(heap: &crate::HeapTotals, out: &mut dyn Write) -> io::Result<()> {
    let entries = &heap.allocators;
    let first = entries.first().map(|entry| &entry.allocators);
    if entries.iter().all(|entry| Some(&entry.allocators) == first) {
        if let Some(entry) = entries.first() {
            writeln!(out, "allocators counted: {}", entry.describe())?;
        }
    } else {
        writeln!(out, "allocators counted:")?;
        for entry in entries.iter().take(ALLOCATOR_LINES) {
            writeln!(out, "  {}: {}", entry.who(), entry.describe())?;
        }
        if entries.len() > ALLOCATOR_LINES {
            writeln!(
                out,
                "  ... and {} more (the JSON output lists them all)",
                entries.len() - ALLOCATOR_LINES
            )?;
        }
    }
    for warning in entries.iter().filter_map(|entry| entry.warning()) {
        writeln!(out, "warning: {warning}")?;
    }
    Ok(())
}

/// `n B`, with the KiB/MiB/GiB figure beside it from 1 KiB up.
fn bytes(n: i64) -> String {
    let units = [("GiB", 1i64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match units.iter().find(|(_, size)| n.abs() >= *size) {
        Some((unit, size)) => format!("{n} B ({:.1} {unit})", n as f64 / *size as f64),
        None => format!("{n} B"),
    }
}

/// The sizes bucket `k` holds: `0`, or `[2^(k-1), 2^k)`; the last one is open.
fn bucket_label(k: usize) -> String {
    match k {
        0 => "0".to_string(),
        _ if k == ALLOC_BUCKETS - 1 => format!("[{}, ...)", 1u64 << (k - 1)),
        _ => format!("[{}, {})", 1u64 << (k - 1), 1u64 << k),
    }
}

/// The non-empty range of a histogram's buckets, as bars.
fn histogram(out: &mut dyn Write, buckets: &[i64]) -> io::Result<()> {
    let Some(first) = buckets.iter().position(|&n| n > 0) else {
        return Ok(());
    };
    let last = buckets.iter().rposition(|&n| n > 0).unwrap_or(first);
    let most = buckets.iter().copied().max().unwrap_or(1).max(1) as u64;
    writeln!(out, "   {:>24} {:>10}", "size (bytes)", "count")?;
    for (k, &count) in buckets.iter().enumerate().take(last + 1).skip(first) {
        let width = (count.max(0) as u64 * BAR_WIDTH).div_ceil(most) as usize;
        writeln!(
            out,
            "   {:>24} {:>10} |{:<bar$}|",
            bucket_label(k),
            count,
            "@".repeat(width),
            bar = BAR_WIDTH as usize
        )?;
    }
    Ok(())
}

/// The stack innermost first (`f <- caller <- ...`), runs of one function folded into
/// `f x N`, cut after a few names.
fn describe_stack(profile: &Profile, sample: &Sample) -> String {
    let mut names: Vec<(String, usize)> = Vec::new();
    for &id in &sample.stack {
        for frame in &profile.locations[id].frames {
            match names.last_mut() {
                Some((last, count)) if *last == frame.function => *count += 1,
                _ => names.push((frame.function.clone(), 1)),
            }
        }
    }
    let shown: Vec<String> = names
        .iter()
        .take(FRAMES_SHOWN)
        .map(|(name, count)| match count {
            1 => name.clone(),
            n => format!("{name} x{n}"),
        })
        .collect();
    let mut text = shown.join(" <- ");
    if names.len() > FRAMES_SHOWN {
        text.push_str(" <- ...");
    }
    if let Some(reason) = &sample.truncated {
        text.push_str(&format!(" [truncated: {reason}]"));
    }
    if text.is_empty() {
        text.push_str("[no stack]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_labels() {
        assert_eq!(bucket_label(0), "0");
        assert_eq!(bucket_label(1), "[1, 2)");
        assert_eq!(bucket_label(7), "[64, 128)");
        assert!(bucket_label(ALLOC_BUCKETS - 1).ends_with(", ...)"));
    }

    #[test]
    fn bars_scale_to_the_largest_bucket() {
        let mut buckets = vec![0i64; ALLOC_BUCKETS];
        buckets[7] = 100;
        buckets[9] = 25;
        let mut out = Vec::new();
        histogram(&mut out, &buckets).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].contains("[64, 128)") && lines[1].contains(&"@".repeat(40)));
        assert!(lines[2].contains("[128, 256)") && !lines[2].contains('@'));
        assert!(lines[3].contains(&format!("|{}{}|", "@".repeat(10), " ".repeat(30))));
    }

    #[test]
    fn a_profile_without_heap_says_so() {
        let mut out = Vec::new();
        write(&crate::writers::tests::example(), OrderBy::Bytes, &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("no heap profile"));
    }
}
