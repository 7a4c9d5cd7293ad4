//! pprof's profile.proto, gzipped: what `go tool pprof`, Pyroscope, Parca and Grafana
//! read.
//!
//! The profile maps onto pprof's model one to one: value types, mappings (with build ids
//! and file offsets), locations (with their inline frames as pprof's `line`s, innermost
//! first), functions (name and file). Kernel locations sit in a `[kernel.kallsyms]`
//! mapping of their own. Where the folded output adds root frames (the probe when there
//! are several, `[truncated: REASON]`, `[no stack]`), the pprof output adds the same as
//! locations without a mapping, so that both show the same tree; each sample also carries
//! `pid`, `probe` and (when it applies) `truncated` labels.
//!
//! A heap profile is written in Go's heap convention (runtime/pprof's, which jeprof's
//! files become in pprof, and which Pyroscope and Parca key their heap views on):
//! `alloc_objects`/`count`, `alloc_space`/`bytes`, `inuse_objects`/`count`,
//! `inuse_space`/`bytes` first, `inuse_space` the default; "in use" is what was live when
//! the profile was taken (the end of tracing, or the SIGUSR1 snapshot). Each sample has
//! its block size as the numeric label `bytes`, as Go computes it: `alloc_space /
//! alloc_objects`. Go keeps one record per stack and size, so its label is the size; the
//! heap programs count one record per stack, with sizes in log2 buckets, so here the
//! label is the stack's mean block size, exact for a stack that allocates one size
//! (pprof labels the per-stack records of jeprof and gperftools heap files the same way).
//! The other heap values follow as extra sample types, as many as keep the list at
//! [`MAX_SAMPLE_TYPES`]: the histogram buckets stay in the CSV and JSON outputs.
//! Any other profile keeps its value types as they are, the first the default.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::UNIX_EPOCH;

use prost::Message;

use crate::{self as profile, heap, Profile, SamplingMode, ValueType};

/// The most sample types a heap profile's file has: Go's four and what else fits
/// without crowding the reader's list of values.
pub const MAX_SAMPLE_TYPES: usize = 12;

/// Go's heap sample types, in Go's order, and the heap values they carry.
const GO_HEAP: [(&str, &str, &str); 4] = [
    ("alloc_objects", "count", heap::ALLOCS),
    ("alloc_space", "bytes", heap::ALLOC_SPACE),
    ("inuse_objects", "count", heap::LEAKED_BLOCKS),
    ("inuse_space", "bytes", heap::LEAKED_BYTES),
];

/// Go's default sample type of a heap profile.
const GO_HEAP_DEFAULT: &str = "inuse_space";

/// The heap values that follow Go's four, under their own names, most telling first:
/// as many as fit in [`MAX_SAMPLE_TYPES`] after the values of other probes.
const HEAP_EXTRAS: [&str; 6] = [
    heap::FREES,
    heap::FREED_SPACE,
    heap::TEMPORARIES,
    heap::PEAK_BYTES,
    heap::LEAKED_AGE,
    heap::UNTRACKED,
];

/// The sample types of the file, each with the profile's value it carries.
struct SampleTypes {
    columns: Vec<(ValueType, usize)>,
    /// The kind of the default sample type.
    default: Option<String>,
    /// For a heap profile: the profile's values of allocations and of their bytes, whose
    /// quotient is a sample's `bytes` label.
    block_size: Option<(usize, usize)>,
}

impl SampleTypes {
    fn of(profile: &Profile) -> SampleTypes {
        let (Some(_), Some(allocs), Some(bytes)) = (
            &profile.heap,
            profile.value_index(heap::ALLOCS),
            profile.value_index(heap::ALLOC_SPACE),
        ) else {
            return SampleTypes {
                columns: profile.value_types.iter().cloned().zip(0..).collect(),
                default: profile.value_types.first().map(|t| t.kind.clone()),
                block_size: None,
            };
        };
        let mut columns: Vec<(ValueType, usize)> = GO_HEAP
            .iter()
            .filter_map(|&(kind, unit, source)| {
                Some((ValueType::new(kind, unit), profile.value_index(source)?))
            })
            .collect();
        // The values of the session's other probes, beside the heap's (e.g. a clock's).
        columns.extend(
            (profile.value_types.iter().cloned().zip(0..))
                .filter(|(t, _)| !heap::is_heap_value(&t.kind)),
        );
        for source in HEAP_EXTRAS {
            if columns.len() >= MAX_SAMPLE_TYPES {
                break;
            }
            if let Some(index) = profile.value_index(source) {
                columns.push((profile.value_types[index].clone(), index));
            }
        }
        SampleTypes {
            columns,
            default: Some(GO_HEAP_DEFAULT.to_string()),
            block_size: Some((allocs, bytes)),
        }
    }

    /// The `bytes` label of a heap sample: its mean block size, none where it allocated
    /// nothing.
    fn block_size(&self, values: &[i64]) -> Option<i64> {
        let (allocs, bytes) = self.block_size?;
        (values[allocs] > 0 && values[bytes] > 0).then(|| values[bytes] / values[allocs])
    }
}

/// The generated pprof types.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// Writes `profile` as a gzipped profile.proto.
pub fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let bytes = encode(profile).encode_to_vec();
    let mut gzip = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gzip.write_all(&bytes)?;
    gzip.finish()?;
    Ok(())
}

/// `profile` as pprof's message.
pub fn encode(profile: &Profile) -> proto::Profile {
    let mut encoder = Encoder::default();
    encoder.strings.intern("");
    encoder.encode(profile)
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn intern(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_string());
        self.index.insert(text.to_string(), index);
        index
    }
}

#[derive(Default)]
struct Encoder {
    strings: Strings,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, Option<String>), u64>,
    /// Locations added for root frames that are not code, by name.
    pseudo_locations: HashMap<String, u64>,
    extra_locations: Vec<proto::Location>,
}

impl Encoder {
    fn encode(mut self, profile: &Profile) -> proto::Profile {
        let types = SampleTypes::of(profile);
        let sample_type: Vec<proto::ValueType> = types
            .columns
            .iter()
            .map(|(t, _)| self.value_type(t))
            .collect();
        // pprof takes the first mapping for the program's: the target's executable goes
        // first, the others keep their order.
        let mut order: Vec<usize> = (0..profile.mappings.len()).collect();
        let executable = profile.metadata.executable.as_deref();
        order.sort_by_key(|&index| Some(profile.mappings[index].path.as_str()) != executable);
        let mut mapping_id = vec![0; profile.mappings.len()];
        for (position, &index) in order.iter().enumerate() {
            mapping_id[index] = position as u64 + 1;
        }
        let mut mappings: Vec<proto::Mapping> = order
            .iter()
            .map(|&index| (index, &profile.mappings[index]))
            .map(|(index, m)| proto::Mapping {
                id: mapping_id[index],
                memory_start: m.start,
                memory_limit: m.end,
                file_offset: m.file_offset,
                filename: self.strings.intern(&m.path),
                build_id: m
                    .build_id
                    .as_deref()
                    .map_or(0, |id| self.strings.intern(id)),
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            })
            .collect();
        let kernel_mapping = self.kernel_mapping(profile, mappings.len() as u64 + 1);
        let kernel_mapping_id = kernel_mapping.as_ref().map_or(0, |m| m.id);
        mappings.extend(kernel_mapping);

        let mut locations: Vec<proto::Location> = profile
            .locations
            .iter()
            .enumerate()
            .map(|(index, location)| proto::Location {
                id: index as u64 + 1,
                mapping_id: match (location.kernel, location.mapping) {
                    (true, _) => kernel_mapping_id,
                    (false, Some(mapping)) => mapping_id[mapping],
                    (false, None) => 0,
                },
                address: location.address,
                line: location
                    .frames
                    .iter()
                    .map(|frame| proto::Line {
                        function_id: self.function(frame),
                        line: frame.line.map_or(0, i64::from),
                    })
                    .collect(),
                is_folded: false,
            })
            .collect();
        let first_extra = locations.len() as u64 + 1;

        let several_probes = profile.probes.len() > 1;
        let samples: Vec<proto::Sample> = profile
            .samples
            .iter()
            .map(|sample| {
                let mut location_id: Vec<u64> =
                    sample.stack.iter().map(|&id| id as u64 + 1).collect();
                // Root frames, outermost last (pprof lists the leaf first).
                if let Some(reason) = &sample.truncated {
                    location_id
                        .push(self.pseudo_location(&format!("[truncated: {reason}]"), first_extra));
                }
                if several_probes {
                    location_id
                        .push(self.pseudo_location(&profile.probes[sample.probe], first_extra));
                } else if location_id.is_empty() {
                    location_id.push(self.pseudo_location("[no stack]", first_extra));
                }
                let mut label = vec![
                    proto::Label {
                        key: self.strings.intern("pid"),
                        str: 0,
                        num: i64::from(sample.pid),
                        num_unit: 0,
                    },
                    proto::Label {
                        key: self.strings.intern("probe"),
                        str: self.strings.intern(&profile.probes[sample.probe]),
                        num: 0,
                        num_unit: 0,
                    },
                ];
                if let Some(reason) = &sample.truncated {
                    label.push(proto::Label {
                        key: self.strings.intern("truncated"),
                        str: self.strings.intern(reason),
                        num: 0,
                        num_unit: 0,
                    });
                }
                if let Some(size) = types.block_size(&sample.values) {
                    // Without a unit, as Go writes it: pprof knows `bytes` as a size.
                    label.push(proto::Label {
                        key: self.strings.intern("bytes"),
                        str: 0,
                        num: size,
                        num_unit: 0,
                    });
                }
                proto::Sample {
                    location_id,
                    value: types
                        .columns
                        .iter()
                        .map(|&(_, i)| sample.values[i])
                        .collect(),
                    label,
                }
            })
            .collect();
        locations.append(&mut self.extra_locations);

        let metadata = &profile.metadata;
        let (period_type, period) = match (&metadata.period, &profile.heap) {
            (Some((kind, amount)), _) => (Some(self.value_type(kind)), *amount),
            // As Go states its sampling rate: what one counted event stands for.
            (None, Some(heap)) => {
                let (kind, amount) = match heap.sampling_mode {
                    None => (ValueType::new("space", "bytes"), 1),
                    Some(SamplingMode::PerBytes(bytes)) => (
                        ValueType::new("space", "bytes"),
                        i64::try_from(bytes).unwrap_or(i64::MAX),
                    ),
                    Some(SamplingMode::EveryNth(n)) => {
                        (ValueType::new("alloc_objects", "count"), i64::from(n))
                    }
                };
                (Some(self.value_type(&kind)), amount)
            }
            (None, None) => (None, 0),
        };
        let mut comment = Vec::new();
        if let Some(command) = &metadata.command {
            comment.push(
                self.strings
                    .intern(&format!("command: {}", command.join(" "))),
            );
        }
        comment.push(
            self.strings
                .intern(&format!("probes: {}", profile.probes.join(" "))),
        );
        if let Some(heap) = &profile.heap {
            for note in [
                "inuse_objects, inuse_space: blocks live when the profile was taken (the end \
                 of tracing, or the SIGUSR1 snapshot)",
                "label bytes: the stack's mean block size, alloc_space / alloc_objects \
                 (sizes are counted per stack in log2 buckets: the CSV and JSON outputs \
                 have them)",
            ] {
                comment.push(self.strings.intern(note));
            }
            for note in [&heap.sampling, &heap.size_filter].into_iter().flatten() {
                comment.push(self.strings.intern(note));
            }
        }
        let default_sample_type = types
            .default
            .as_deref()
            .map_or(0, |kind| self.strings.intern(kind));
        proto::Profile {
            sample_type,
            sample: samples,
            mapping: mappings,
            location: locations,
            function: self.functions,
            string_table: self.strings.table,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: metadata
                .started
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            duration_nanos: i64::try_from(metadata.duration.as_nanos()).unwrap_or(i64::MAX),
            period_type,
            period,
            comment,
            default_sample_type,
        }
    }

    fn value_type(&mut self, t: &profile::ValueType) -> proto::ValueType {
        proto::ValueType {
            r#type: self.strings.intern(&t.kind),
            unit: self.strings.intern(&t.unit),
        }
    }

    fn function(&mut self, frame: &crate::Frame) -> u64 {
        let key = (frame.function.clone(), frame.file.clone());
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.strings.intern(&frame.function);
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            filename: frame.file.as_deref().map_or(0, |f| self.strings.intern(f)),
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }

    /// A location for a root frame that is not code (a probe, a truncation).
    fn pseudo_location(&mut self, name: &str, first_id: u64) -> u64 {
        if let Some(&id) = self.pseudo_locations.get(name) {
            return id;
        }
        let id = first_id + self.extra_locations.len() as u64;
        let function_id = self.function(&crate::Frame {
            function: name.to_string(),
            file: None,
            line: None,
        });
        self.extra_locations.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line {
                function_id,
                line: 0,
            }],
            is_folded: false,
        });
        self.pseudo_locations.insert(name.to_string(), id);
        id
    }

    /// One mapping covering every kernel address of the profile, named as perf names it.
    fn kernel_mapping(&mut self, profile: &Profile, id: u64) -> Option<proto::Mapping> {
        let kernel = profile.locations.iter().filter(|l| l.kernel);
        let start = kernel.clone().map(|l| l.address).min()?;
        let end = kernel.map(|l| l.address).max()?.saturating_add(1);
        Some(proto::Mapping {
            id,
            memory_start: start,
            memory_limit: end,
            file_offset: 0,
            filename: self.strings.intern("[kernel.kallsyms]"),
            build_id: 0,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::writers::tests::{example, golden, leaky_example};

    /// `profile` written, compared with the golden file `name`, and read back.
    fn decoded(profile: &Profile, name: &str) -> proto::Profile {
        let mut gz = Vec::new();
        write(profile, &mut gz).unwrap();
        golden(name, &gz);
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(&*gz)
            .read_to_end(&mut bytes)
            .unwrap();
        proto::Profile::decode(&*bytes).unwrap()
    }

    #[test]
    fn the_example_as_pprof() {
        let profile = example();
        let pprof = decoded(&profile, "example.pb.gz");
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        assert_eq!(text(0), "");
        let types: Vec<(&str, &str)> = pprof
            .sample_type
            .iter()
            .map(|t| (text(t.r#type), text(t.unit)))
            .collect();
        assert_eq!(types, [("events", "count"), ("bytes", "bytes")]);
        assert_eq!(text(pprof.default_sample_type), "events");
        assert_eq!(pprof.duration_nanos, 1_500_000_000);
        assert_eq!(pprof.time_nanos, 1_700_000_000_000_000_000);

        // Every sample, with its values; the totals are the profile's.
        assert_eq!(pprof.sample.len(), profile.samples.len());
        for index in 0..2 {
            let total: i64 = pprof.sample.iter().map(|s| s.value[index]).sum();
            assert_eq!(total, profile.total(index));
        }

        // Mappings: the executable first, then the other user one with its build id and
        // offset, then the kernel's.
        let mapping = &pprof.mapping[1];
        assert_eq!((mapping.id, text(mapping.filename)), (2, "/work/demo"));
        assert_eq!(text(mapping.build_id), "0123abcd");
        assert_eq!(mapping.file_offset, 0x1000);
        let executable = &pprof.mapping[0];
        assert_eq!(executable.id, 1);
        assert_eq!(
            text(executable.filename),
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(executable.build_id, 0);
        assert_eq!(text(pprof.mapping[2].filename), "[kernel.kallsyms]");

        let function = |id: u64| {
            let f = &pprof.function[id as usize - 1];
            assert_eq!(f.id, id);
            (text(f.name), text(f.filename))
        };
        let location = |id: u64| &pprof.location[id as usize - 1];
        // The leaf of the first sample: the inlined helper first, then its caller.
        let first = &pprof.sample[0];
        let leaf = location(first.location_id[0]);
        assert_eq!(leaf.mapping_id, 2);
        assert_eq!(leaf.address, 0x5555_5555_1234);
        let lines: Vec<(&str, &str, i64)> = leaf
            .line
            .iter()
            .map(|l| {
                let (name, file) = function(l.function_id);
                (name, file, l.line)
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("demo::inlined_helper", "src/main.rs", 12),
                ("demo::work", "src/main.rs", 30)
            ]
        );
        // Several probes: each stack ends in its probe, as in the folded output.
        let root = location(*first.location_id.last().unwrap());
        assert_eq!(function(root.line[0].function_id).0, "uprobe:libc:malloc");
        assert_eq!(root.mapping_id, 0);
        // The truncated stack: its reason under the probe, and as a label.
        let truncated = &pprof.sample[1];
        let n = truncated.location_id.len();
        let reason = location(truncated.location_id[n - 2]);
        assert_eq!(
            function(reason.line[0].function_id).0,
            "[truncated: read fault]"
        );
        let labels: Vec<(&str, &str, i64)> = truncated
            .label
            .iter()
            .map(|l| (text(l.key), text(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 42),
                ("probe", "uprobe:libc:malloc", 0),
                ("truncated", "read fault", 0)
            ]
        );
        // Kernel frames are in the kernel's mapping.
        let kernel = location(pprof.sample[2].location_id[0]);
        assert_eq!(kernel.mapping_id, 3);
        assert_eq!(function(kernel.line[0].function_id).0, "do_syscall_64");
    }

    fn types(pprof: &proto::Profile) -> Vec<(&str, &str)> {
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        pprof
            .sample_type
            .iter()
            .map(|t| (text(t.r#type), text(t.unit)))
            .collect()
    }

    /// The period's type, unit and amount.
    fn period(pprof: &proto::Profile) -> (&str, &str, i64) {
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        let period_type = pprof.period_type.as_ref().unwrap();
        (
            text(period_type.r#type),
            text(period_type.unit),
            pprof.period,
        )
    }

    /// The `bytes` labels of the samples.
    fn block_sizes(pprof: &proto::Profile) -> Vec<Option<i64>> {
        pprof
            .sample
            .iter()
            .map(|s| {
                let mut sizes = s
                    .label
                    .iter()
                    .filter(|l| pprof.string_table[l.key as usize] == "bytes");
                let size = sizes.next().map(|l| l.num);
                assert!(sizes.next().is_none());
                size
            })
            .collect()
    }

    #[test]
    fn a_heap_profile_in_gos_convention() {
        let profile = leaky_example();
        let pprof = decoded(&profile, "heap-example.pb.gz");
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        assert_eq!(
            types(&pprof),
            [
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
                ("frees", "count"),
                ("freed_space", "bytes"),
                ("temporaries", "count"),
                ("peak_bytes", "bytes"),
                ("leaked_age", "microseconds"),
                ("untracked", "count"),
            ]
        );
        assert_eq!(text(pprof.default_sample_type), "inuse_space");
        // The leaking site: 200 blocks of 1013 bytes, 150 still live.
        assert_eq!(
            pprof.sample[0].value,
            [
                200,
                202_600,
                150,
                151_950,
                50,
                50_650,
                0,
                202_600,
                180_000_000,
                0
            ]
        );
        // Every value is the profile's, by its kind.
        for (column, (kind, _)) in types(&pprof).into_iter().enumerate().skip(4) {
            let index = profile.value_index(kind).unwrap();
            let total: i64 = pprof.sample.iter().map(|s| s.value[column]).sum();
            assert_eq!(total, profile.total(index), "{kind}");
        }
        // Go's block size: exact for a site of one size, the mean of the mixed one's.
        assert_eq!(block_sizes(&pprof), [Some(1013), Some(64), Some(696)]);
        let pid = |s: &proto::Sample| s.label.iter().find(|l| text(l.key) == "pid").unwrap().num;
        assert_eq!(pid(&pprof.sample[2]), 43);
        // Every allocation counted: one byte stands for one.
        assert_eq!(period(&pprof), ("space", "bytes", 1));
        let comments: Vec<&str> = pprof.comment.iter().map(|&c| text(c)).collect();
        assert!(
            comments
                .iter()
                .any(|c| c.starts_with("label bytes: the stack's mean")),
            "{comments:?}"
        );
    }

    #[test]
    fn a_sampled_heap_profile_states_its_period() {
        let mut profile = leaky_example();
        let heap = profile.heap.as_mut().unwrap();
        heap.sampling_mode = Some(SamplingMode::PerBytes(524_288));
        heap.sampling = Some("an allocation of s bytes counted with a chance of s/524288".into());
        let pprof = encode(&profile);
        assert_eq!(period(&pprof), ("space", "bytes", 524_288));
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        assert!(pprof.comment.iter().any(|&c| text(c).contains("s/524288")));
        profile.heap.as_mut().unwrap().sampling_mode = Some(SamplingMode::EveryNth(10));
        assert_eq!(period(&encode(&profile)), ("alloc_objects", "count", 10));
    }

    /// Beside the most values other probes have (clock and off-CPU together), Go's four
    /// stay first and the extras fill the list up to twelve.
    #[test]
    fn a_heap_profile_beside_other_probes_has_twelve_types_at_most() {
        let mut profile = leaky_example();
        let others = ["time", "cpu", "off-cpu", "samples", "blocks"];
        let mut value_types: Vec<ValueType> = others
            .iter()
            .map(|kind| ValueType::new(kind, "count"))
            .collect();
        value_types.append(&mut profile.value_types);
        profile.value_types = value_types;
        for sample in &mut profile.samples {
            sample.values.splice(0..0, [0; 5]);
        }
        let mut clock = profile.samples[0].clone();
        clock.probe = 1;
        clock.values = vec![0; profile.value_types.len()];
        clock.values[..5].copy_from_slice(&[10, 10, 0, 1, 0]);
        profile.samples.push(clock);
        profile.probes.push("profile:hz:99".into());

        let pprof = encode(&profile);
        let kinds: Vec<&str> = types(&pprof).into_iter().map(|(kind, _)| kind).collect();
        assert_eq!(
            kinds,
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space",
                "time",
                "cpu",
                "off-cpu",
                "samples",
                "blocks",
                "frees",
                "freed_space",
                "temporaries"
            ]
        );
        assert_eq!(kinds.len(), MAX_SAMPLE_TYPES);
        assert_eq!(
            pprof.sample[3].value,
            [0, 0, 0, 0, 10, 10, 0, 1, 0, 0, 0, 0]
        );
        assert_eq!(block_sizes(&pprof)[3], None);
    }
}
