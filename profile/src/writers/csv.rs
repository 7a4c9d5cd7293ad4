//! CSV for spreadsheets: one row per sample (probe, process, stack) with every value of
//! the profile, e.g. a heap profile's counters and each bucket of its histograms.

use std::io::{self, Write};

use super::{folded, Weighting};
use crate::Profile;

/// Writes a header (`probe,pid,truncated,stack,` then each value type's kind) and a row
/// per sample; the stack is folded (`root;...;leaf`).
pub fn write(profile: &Profile, weighting: Weighting, out: &mut dyn Write) -> io::Result<()> {
    let mut header = vec![
        "probe".to_string(),
        "pid".into(),
        "truncated".into(),
        "stack".into(),
    ];
    header.extend(profile.value_types.iter().map(|t| t.kind.clone()));
    write_row(out, &header)?;
    let mut lines = folded::Lines::new(profile, weighting.line_numbers);
    for sample in &profile.samples {
        let mut row = vec![
            profile.probes[sample.probe].clone(),
            sample.pid.to_string(),
            sample.truncated.clone().unwrap_or_default(),
            lines.line(sample),
        ];
        row.extend(sample.values.iter().map(i64::to_string));
        write_row(out, &row)?;
    }
    Ok(())
}

/// Writes a heap profile's timeline: one row per point, `ms,live_bytes,allocs_per_s,
/// frees_per_s,rss_bytes` (the rates since the point before). A profile without heap
/// data has a header only.
pub fn write_timeline(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "ms,live_bytes,allocs_per_s,frees_per_s,rss_bytes")?;
    let Some(heap) = &profile.heap else {
        return Ok(());
    };
    let mut before: Option<&crate::HeapPoint> = None;
    for point in &heap.timeline {
        let rate = |now: u64, then: Option<u64>| match before {
            Some(b) if point.at > b.at => {
                (now.saturating_sub(then.unwrap_or(0))) as f64 / (point.at - b.at).as_secs_f64()
            }
            _ => 0.0,
        };
        writeln!(
            out,
            "{},{},{:.0},{:.0},{}",
            point.at.as_millis(),
            point.live_bytes,
            rate(point.allocs, before.map(|b| b.allocs)),
            rate(point.frees, before.map(|b| b.frees)),
            point.rss_bytes
        )?;
        before = Some(point);
    }
    Ok(())
}

fn write_row(out: &mut dyn Write, fields: &[String]) -> io::Result<()> {
    let quoted: Vec<String> = fields.iter().map(|f| quote(f)).collect();
    writeln!(out, "{}", quoted.join(","))
}

/// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden};

    #[test]
    fn fields_are_quoted_when_they_must_be() {
        assert_eq!(quote("a;b"), "a;b");
        assert_eq!(quote("<[u8; 4], T>"), "\"<[u8; 4], T>\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn timeline_rates_are_per_second_since_the_point_before() {
        use crate::{HeapPoint, HeapTotals};
        use std::time::Duration;
        let point = |ms, live_bytes, allocs, frees| HeapPoint {
            at: Duration::from_millis(ms),
            live_bytes,
            allocs,
            frees,
            rss_bytes: 4096,
        };
        let mut profile = example();
        profile.heap = Some(HeapTotals {
            timeline: vec![
                point(0, 0, 0, 0),
                point(100, 640, 50, 40),
                point(300, 0, 50, 50),
            ],
            ..HeapTotals::default()
        });
        let mut out = Vec::new();
        write_timeline(&profile, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ms,live_bytes,allocs_per_s,frees_per_s,rss_bytes\n0,0,0,0,4096\n\
             100,640,500,400,4096\n300,0,0,50,4096\n"
        );
    }

    #[test]
    fn golden_csv() {
        let mut out = Vec::new();
        write(&example(), Weighting::default(), &mut out).unwrap();
        golden("example.csv", &out);
    }
}
