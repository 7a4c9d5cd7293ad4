//! CSV for spreadsheets: one row per sample (probe, process, stack) with every value of
//! the profile, e.g. a heap profile's counters and each bucket of its histograms.

use std::io::{self, Write};

use super::{folded, Weighting};
use crate::profile::Profile;

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
    for sample in &profile.samples {
        let mut row = vec![
            profile.probes[sample.probe].clone(),
            sample.pid.to_string(),
            sample.truncated.clone().unwrap_or_default(),
            folded::frames(profile, sample, weighting.line_numbers).join(";"),
        ];
        row.extend(sample.values.iter().map(i64::to_string));
        write_row(out, &row)?;
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
    fn golden_csv() {
        let mut out = Vec::new();
        write(&example(), Weighting::default(), &mut out).unwrap();
        golden("example.csv", &out);
    }
}
