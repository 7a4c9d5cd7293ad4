//! Differential flamegraphs: two profiles (folded stacks or pprof files, as the writers
//! write them) compared by inferno. Frames are sized by AFTER and colored by the change
//! from BEFORE: red grew, blue shrank. With `normalize`, BEFORE is scaled to AFTER's total
//! first, so that a longer run does not paint everything red.

use std::collections::BTreeMap;
use std::io::Read;

use prost::Message;

use crate::writers::pprof::proto;

/// Why two profiles could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{name} is not a pprof profile: {reason}")]
    NotPprof { name: String, reason: String },
    #[error("{name} is neither folded stacks nor pprof{detail}")]
    NotAProfile { name: String, detail: String },
    #[error("comparing the profiles: {0}")]
    Compare(std::io::Error),
    #[error("drawing the differential flamegraph: {0}")]
    Draw(std::io::Error),
}

/// inferno's differential folded lines (`stack BEFORE AFTER`) of two folded texts.
pub fn differential_lines(before: &str, after: &str, normalize: bool) -> Result<String, DiffError> {
    let options = inferno::differential::Options {
        normalize,
        strip_hex: false,
    };
    let mut out = Vec::new();
    inferno::differential::from_readers(options, before.as_bytes(), after.as_bytes(), &mut out)
        .map_err(DiffError::Compare)?;
    Ok(String::from_utf8(out).expect("inferno writes the names it read"))
}

/// The differential flamegraph of `lines` ([`differential_lines`]), as SVG.
pub fn draw(lines: &str, title: String) -> Result<Vec<u8>, DiffError> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title;
    options.hash = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(
        &mut options,
        lines.lines().filter(|line| !line.is_empty()),
        &mut svg,
    )
    .map_err(DiffError::Draw)?;
    Ok(svg)
}

/// The profile in `bytes` (the file `name`) as folded text: folded stacks as they are, a
/// (gzipped) pprof file folded by its default value ([`default_value`]).
pub fn fold(name: &str, bytes: Vec<u8>) -> Result<String, DiffError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let not_pprof = |reason: String| DiffError::NotPprof {
            name: name.to_string(),
            reason,
        };
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&*bytes)
            .read_to_end(&mut raw)
            .map_err(|error| not_pprof(error.to_string()))?;
        let profile =
            proto::Profile::decode(&*raw).map_err(|error| not_pprof(error.to_string()))?;
        return Ok(fold_pprof(&profile));
    }
    let not_a_profile = |detail: String| DiffError::NotAProfile {
        name: name.to_string(),
        detail,
    };
    let text = String::from_utf8(bytes).map_err(|_| not_a_profile(String::new()))?;
    for line in text.lines().filter(|line| !line.is_empty()) {
        let count = line.rsplit_once(' ').map(|(_, count)| count);
        if count.is_none_or(|count| count.parse::<u64>().is_err()) {
            return Err(not_a_profile(format!(" (line {line:?})")));
        }
    }
    Ok(text)
}

/// The index of the value that `go tool pprof` shows by default: the default sample type
/// if the file names one (the first of a CPU profile's, `inuse_space` of a heap profile's),
/// else the last sample type, as pprof does.
fn default_value(profile: &proto::Profile) -> usize {
    let text = |index: i64| string(profile, index);
    let default = text(profile.default_sample_type);
    profile
        .sample_type
        .iter()
        .position(|t| !default.is_empty() && text(t.r#type) == default)
        .unwrap_or(profile.sample_type.len().saturating_sub(1))
}

fn string(profile: &proto::Profile, index: i64) -> &str {
    profile
        .string_table
        .get(usize::try_from(index).unwrap_or(usize::MAX))
        .map_or("", String::as_str)
}

/// pprof samples folded by their default value, root first, inline frames expanded.
fn fold_pprof(profile: &proto::Profile) -> String {
    let text = |index: i64| string(profile, index);
    let value = default_value(profile);
    let functions: BTreeMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, text(f.name)))
        .collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| text(m.filename) == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    let locations: BTreeMap<u64, &proto::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.sample {
        let Some(&weight) = sample.value.get(value) else {
            continue;
        };
        let mut frames: Vec<String> = Vec::new();
        for id in sample.location_id.iter().rev() {
            let Some(location) = locations.get(id) else {
                continue;
            };
            let kernel = kernel_mappings.contains(&location.mapping_id);
            for line in location.line.iter().rev() {
                let name = functions
                    .get(&line.function_id)
                    .copied()
                    .unwrap_or("[unknown]");
                let name = name.replace(';', ":");
                frames.push(if kernel { format!("{name}_[k]") } else { name });
            }
        }
        if frames.is_empty() || weight == 0 {
            continue;
        }
        *lines.entry(frames.join(";")).or_default() += weight;
    }
    lines
        .into_iter()
        .map(|(stack, weight)| format!("{stack} {weight}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::{pprof, tests::example, Weighting};

    #[test]
    fn a_pprof_file_folds_as_the_folded_writer_does() {
        let profile = example();
        let mut folded = Vec::new();
        crate::writers::folded::write(&profile, Weighting::default(), &mut folded).unwrap();
        let decoded = pprof::encode(&profile);
        assert_eq!(fold_pprof(&decoded), String::from_utf8(folded).unwrap());
    }

    /// A heap profile folds by what is in use, as `go tool pprof` shows it by default.
    #[test]
    fn a_heap_pprof_file_folds_by_its_bytes_in_use() {
        let profile = crate::writers::tests::leaky_example();
        let decoded = pprof::encode(&profile);
        assert_eq!(
            decoded.string_table[decoded.sample_type[default_value(&decoded)].r#type as usize],
            "inuse_space"
        );
        let weighting = Weighting {
            value: profile.value_index(crate::heap::LEAKED_BYTES).unwrap(),
            line_numbers: false,
        };
        let mut folded = Vec::new();
        crate::writers::folded::write(&profile, weighting, &mut folded).unwrap();
        let folded = String::from_utf8(folded).unwrap();
        assert_eq!(fold_pprof(&decoded), folded);
        assert!(
            folded.contains("main;leak_site;malloc 151950\n"),
            "{folded}"
        );
        // Without a default sample type, pprof shows the last.
        let mut without_default = decoded;
        without_default.default_sample_type = 0;
        assert_eq!(
            default_value(&without_default),
            without_default.sample_type.len() - 1
        );
    }

    #[test]
    fn the_grown_stack_gets_the_larger_after_count() {
        let before = "main;hot 200\nmain;cold 100\n";
        let after = "main;hot 100\nmain;cold 200\n";
        let lines = differential_lines(before, after, true).unwrap();
        assert!(lines.contains("main;cold 100 200"), "{lines}");
        assert!(lines.contains("main;hot 200 100"), "{lines}");
        // Normalized: BEFORE is scaled to AFTER's total.
        let doubled = differential_lines(before, "main;hot 400\nmain;cold 200\n", true).unwrap();
        assert!(doubled.contains("main;hot 400 400"), "{doubled}");
    }

    #[test]
    fn bad_input_is_refused_in_one_line() {
        let error = fold("bad", b"not a profile\n".to_vec())
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "bad is neither folded stacks nor pprof (line \"not a profile\")"
        );
    }
}
