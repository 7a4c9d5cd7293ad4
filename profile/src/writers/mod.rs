//! Writers: each turns a [`Profile`] into one output format.
//!
//! A writer knows its format and nothing of the session: it reads the profile and writes
//! bytes to any [`std::io::Write`]. Where the bytes go (which file, created how) is the
//! caller's business.

pub mod csv;
#[cfg(test)]
pub(crate) mod examples;
pub mod folded;
pub mod heap_report;
pub mod heaptrack;
pub mod html;
pub mod json;
pub mod pprof;
pub mod speedscope;
pub mod summary;
pub mod svg;

use std::io::{self, Write};

use crate::Profile;

/// Every output format, each with its writer: the one list the command line and the
/// session ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The flamegraph (`-o`, `flamegraph.svg` unless `--no-svg`).
    Svg,
    /// Folded stacks (`--folded`).
    Folded,
    /// pprof's gzipped profile.proto (`--pprof`).
    Pprof,
    /// Every sample, location and counter as JSON (`--json`; docs/json.md).
    Json,
    /// speedscope's file format (`--speedscope`).
    Speedscope,
    /// One self-contained HTML report (`--report`).
    Html,
    /// The heap profile's text report (`--report-text`).
    HeapReport,
    /// One CSV row per stack with every value (`--csv`).
    Csv,
    /// The heap's memory over time, CSV (`--timeline`).
    Timeline,
    /// A heaptrack data file (`--heaptrack`), compressed as its name says.
    Heaptrack(heaptrack::Compression),
}

impl Format {
    /// What the file holds, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Format::Svg => "flamegraph",
            Format::Folded => "folded stacks",
            Format::Pprof => "pprof profile",
            Format::Json => "JSON profile",
            Format::Speedscope => "speedscope profile",
            Format::Html => "HTML report",
            Format::HeapReport => "heap report",
            Format::Csv => "CSV table",
            Format::Timeline => "heap timeline",
            Format::Heaptrack(_) => "heaptrack data file",
        }
    }

    pub fn write(
        self,
        profile: &Profile,
        options: &Options,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        match self {
            Format::Svg => svg::write(profile, options.weighting, &options.title, out),
            Format::Folded => folded::write(profile, options.weighting, out),
            Format::Pprof => pprof::write(profile, out),
            Format::Json => json::write(profile, out),
            Format::Speedscope => speedscope::write(profile, options.weighting, out),
            Format::Html => html::write(profile, options, out),
            Format::HeapReport => heap_report::write(profile, options.order_by, out),
            Format::Csv => csv::write(profile, options.weighting, out),
            Format::Timeline => csv::write_timeline(profile, out),
            Format::Heaptrack(compression) => heaptrack::write(profile, compression, out),
        }
    }
}

/// What the writers are told beside the profile.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub weighting: Weighting,
    /// The flamegraph's title.
    pub title: String,
    /// The order of the heap report's stacks.
    pub order_by: crate::heap::OrderBy,
}

/// Which of a sample's values a writer weighs stacks by, and how frames are named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weighting {
    /// Index into the profile's value types.
    pub value: usize,
    /// Name frames `function (file:line)`: each source line of a function is its own frame.
    pub line_numbers: bool,
}

#[cfg(test)]
pub(crate) mod tests {
    //! Golden files: each writer's output for one hand-made profile, compared byte for
    //! byte with `cargo-trace/tests/data/`. `UPDATE_GOLDEN=1` rewrites them (check the
    //! diff before committing it).

    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::Frame;
    use crate::{Location, Lost, Mapping, Metadata, Profile, Sample, Summary, ValueType};

    /// A count the collector reports, with the options that raise its limit.
    pub(crate) fn lost(what: &str, count: u64, raised_by: &'static [&'static str]) -> Lost {
        Lost {
            what: what.to_string(),
            count,
            raised_by,
        }
    }

    fn frame(function: &str, file: Option<&str>, line: Option<u32>) -> Frame {
        Frame {
            function: function.to_string(),
            file: file.map(str::to_string),
            line,
        }
    }

    /// Two probes; a stack through an inlined function, one truncated, one with kernel
    /// frames, one with no stack, one that weighs nothing, a name with a `;`; a limit met
    /// and a loss no option changes.
    pub(crate) fn example() -> Profile {
        let user = |address, mapping, frames| Location {
            address,
            mapping: Some(mapping),
            frames,
            kernel: false,
        };
        let locations = vec![
            // 0: leaf, with an inlined callee (innermost first)
            user(
                0x5555_5555_1234,
                0,
                vec![
                    frame("demo::inlined_helper", Some("src/main.rs"), Some(12)),
                    frame("demo::work", Some("src/main.rs"), Some(30)),
                ],
            ),
            // 1: main
            user(
                0x5555_5555_2000,
                0,
                vec![frame("demo::main", Some("src/main.rs"), Some(40))],
            ),
            // 2: in libc
            user(
                0x7fff_f7e0_0100,
                1,
                vec![frame("__libc_start_call_main", None, None)],
            ),
            // 3: a name with a semicolon
            user(
                0x5555_5555_3000,
                0,
                vec![frame("<[u8; 4] as demo::Fill>::fill", None, None)],
            ),
            // 4: kernel
            Location {
                address: 0xffff_ffff_8100_0000,
                mapping: None,
                frames: vec![frame("do_syscall_64", None, None)],
                kernel: true,
            },
        ];
        let sample = |probe, stack: &[usize], truncated: Option<&str>, values: &[i64]| Sample {
            probe,
            pid: 42,
            stack: stack.to_vec(),
            truncated: truncated.map(str::to_string),
            values: values.to_vec(),
        };
        Profile {
            value_types: vec![
                ValueType::new("events", "count"),
                ValueType::new("bytes", "bytes"),
            ],
            probes: vec!["uprobe:libc:malloc".into(), "profile:hz:99".into()],
            samples: vec![
                sample(0, &[0, 1, 2], None, &[5, 500]),
                sample(0, &[3, 1], Some("read fault"), &[2, 64]),
                sample(1, &[4, 0, 1, 2], None, &[3, 0]),
                sample(1, &[], None, &[1, 0]),
                sample(0, &[1, 2], None, &[0, 7]),
            ],
            locations,
            mappings: vec![
                Mapping {
                    start: 0x5555_5555_0000,
                    end: 0x5555_5556_0000,
                    file_offset: 0x1000,
                    path: "/work/demo".into(),
                    build_id: Some("0123abcd".into()),
                },
                Mapping {
                    start: 0x7fff_f7e0_0000,
                    end: 0x7fff_f7f8_0000,
                    file_offset: 0x28000,
                    path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                    build_id: None,
                },
            ],
            summary: Summary {
                failures: vec![("read fault".to_string(), 2)],
                losses: vec![
                    lost("known stacks full", 3, &["--max-stacks"]),
                    lost("hash collision", 1, &[]),
                ],
                in_exec: 0,
                no_user_stack: vec![],
                without_table: vec![],
                not_the_targets: 0,
                merged_processes: 0,
            },
            metadata: Metadata {
                command: Some(vec!["./demo".into(), "arg".into()]),
                pid: 42,
                executable: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
                started: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
                duration: Duration::from_millis(1500),
                timeline: vec![
                    crate::TimelinePoint {
                        at: Duration::from_millis(200),
                        walks: 4,
                    },
                    crate::TimelinePoint {
                        at: Duration::from_millis(400),
                        walks: 9,
                    },
                    crate::TimelinePoint {
                        at: Duration::from_millis(1500),
                        walks: 11,
                    },
                ],
                period: None,
            },
            heap: None,
        }
    }

    /// A heap profile of the example's stacks, as a collector of the heap fills it: the
    /// first stack leaks (one block, a day old), the others free theirs, some soon
    /// enough to be temporaries; sizes and lifetimes in their histograms; two processes'
    /// totals, a loss, memory over time.
    pub(crate) fn heap_example() -> Profile {
        use crate::heap;
        use crate::{HeapPoint, HeapProcess, HeapTotals};
        let mut profile = example();
        profile.value_types = heap::value_types();
        let index = |kind: &str| profile.value_index(kind).unwrap();
        let [allocs, bytes, frees, freed, leaked, leaked_bytes, temporaries, peak, age] = [
            heap::ALLOCS,
            heap::ALLOC_SPACE,
            heap::FREES,
            heap::FREED_SPACE,
            heap::LEAKED_BLOCKS,
            heap::LEAKED_BYTES,
            heap::TEMPORARIES,
            heap::PEAK_BYTES,
            heap::LEAKED_AGE,
        ]
        .map(index);
        let sizes = index(&format!("{}0", heap::SIZE_BUCKET));
        let lifetimes = index(&format!("{}0", heap::LIFETIME_BUCKET));
        let width = profile.value_types.len();
        // Heap stacks start at the allocating function's entry.
        let entry = profile.locations.len();
        profile.locations.push(Location {
            address: 0x7fff_f7e0_0200,
            mapping: Some(1),
            frames: vec![frame("malloc", None, None)],
            kernel: false,
        });
        let kernel: Vec<bool> = profile.locations.iter().map(|l| l.kernel).collect();
        for (i, sample) in profile.samples.iter_mut().enumerate() {
            // User stacks only: an allocation is the program's call.
            sample.stack.retain(|&location| !kernel[location]);
            sample.stack.insert(0, entry);
            sample.probe = 0;
            let n = i as i64 + 1;
            sample.values = vec![0; width];
            sample.values[allocs] = n;
            sample.values[bytes] = 100 * n;
            // 100-byte blocks: bit length 7.
            sample.values[sizes + 7] = n;
            if i == 0 {
                sample.values[leaked] = 1;
                sample.values[leaked_bytes] = 100;
                sample.values[peak] = 100;
                sample.values[age] = 86_400_000_000;
            } else {
                sample.values[frees] = n;
                sample.values[freed] = 100 * n;
                sample.values[temporaries] = n - 1;
                // Freed after 500 µs (bit length 19) and 3 s (bit length 32).
                sample.values[lifetimes + 19] = n - 1;
                sample.values[lifetimes + 32] = 1;
            }
        }
        profile.probes = vec!["alloc".into()];
        profile.heap = Some(HeapTotals {
            processes: vec![
                HeapProcess {
                    pid: 42,
                    allocs: 15,
                    bytes: 1500,
                    frees: 14,
                    freed_bytes: 1400,
                    live_bytes: 100,
                    peak_bytes: 300,
                    ..HeapProcess::default()
                },
                HeapProcess {
                    pid: 43,
                    allocs: 2,
                    bytes: 64,
                    frees: 2,
                    freed_bytes: 64,
                    peak_bytes: 64,
                    unknown_frees: 1,
                    ..HeapProcess::default()
                },
            ],
            lost: vec![lost("unknown frees", 1, &[])],
            temporary_threshold: Duration::from_millis(1),
            mapped: Some(crate::MappedMemory {
                counted: false,
                processes: vec![crate::MappedProcess {
                    pid: 42,
                    maps: 3,
                    bytes: 3 << 20,
                    unmaps: 2,
                    unmapped_bytes: 2 << 20,
                    live_bytes: 1 << 20,
                }],
            }),
            in_process: Some(crate::RecorderMemory {
                processes: 2,
                region_used: 6 << 20,
                region_bound: 324 << 20,
                private_bytes: 252 << 10,
                private_bound: 42 << 20,
            }),
            timeline: vec![
                HeapPoint {
                    at: Duration::from_millis(100),
                    live_bytes: 300,
                    allocs: 6,
                    frees: 3,
                    rss_bytes: 4 << 20,
                },
                HeapPoint {
                    at: Duration::from_millis(200),
                    live_bytes: 100,
                    allocs: 17,
                    frees: 16,
                    rss_bytes: 5 << 20,
                },
            ],
            allocators: {
                let libc = crate::AllocatorCounted {
                    name: "libc".into(),
                    prefix: None,
                    object: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                    counted_by: crate::CountedBy::Functions,
                };
                let jemalloc = crate::AllocatorCounted {
                    name: "jemalloc".into(),
                    prefix: Some("_rjem_".into()),
                    object: "/opt/demo/child".into(),
                    counted_by: crate::CountedBy::Functions,
                };
                vec![
                    crate::ProcessAllocators {
                        pid: 42,
                        executable: Some("/opt/demo/demo".into()),
                        processes: 1,
                        allocators: vec![libc.clone()],
                        missed: None,
                    },
                    crate::ProcessAllocators {
                        pid: 43,
                        executable: Some("/opt/demo/child".into()),
                        processes: 1,
                        allocators: vec![jemalloc, libc],
                        missed: Some(crate::AllocatorsMissed {
                            reason: "jemalloc (_rjem_) in /opt/demo/child probed only after \
                                     the process had run (it was found by polling)"
                                .into(),
                            count: 1,
                        }),
                    },
                ]
            },
            ..HeapTotals::default()
        });
        profile
    }

    /// One heap site of [`leaky_example`]: its counts, the bit lengths of its blocks'
    /// sizes with how many of each, and the same of the lifetimes of those freed.
    struct HeapSite {
        allocs: i64,
        bytes: i64,
        frees: i64,
        freed_bytes: i64,
        temporaries: i64,
        peak_bytes: i64,
        leaked_age_us: i64,
        sizes: &'static [(usize, i64)],
        lifetimes: &'static [(usize, i64)],
    }

    /// A heap profile of a program and the child it started: the program's `leak_site`
    /// allocates 200 blocks of 1013 bytes and frees 50, its `churn` 1000 blocks of 64
    /// bytes, 990 of them temporaries, all freed; the child's `mixed_sizes` 10 blocks of
    /// 16 bytes, all freed, and 2 of 4096, both leaked.
    pub(crate) fn leaky_example() -> Profile {
        use crate::heap::{self, *};
        use crate::{HeapProcess, HeapTotals};
        let location = |address, mapping, function: &str| Location {
            address,
            mapping: Some(mapping),
            frames: vec![frame(function, Some("src/main.c"), None)],
            kernel: false,
        };
        let locations = vec![
            location(0x7fff_f7e9_0100, 1, "malloc"),
            location(0x5555_5555_1100, 0, "leak_site"),
            location(0x5555_5555_1200, 0, "churn"),
            location(0x5555_5555_1300, 0, "mixed_sizes"),
            location(0x5555_5555_1400, 0, "main"),
            location(0x7fff_f7e2_9d90, 1, "__libc_start_call_main"),
        ];
        let value_types = heap::value_types();
        let index = |kind: &str| value_types.iter().position(|t| t.kind == kind).unwrap();
        let sample = |pid, site: usize, s: HeapSite| {
            let mut values = vec![0; value_types.len()];
            let leaked = s.allocs - s.frees;
            for (kind, value) in [
                (ALLOCS, s.allocs),
                (ALLOC_SPACE, s.bytes),
                (FREES, s.frees),
                (FREED_SPACE, s.freed_bytes),
                (LEAKED_BLOCKS, leaked),
                (LEAKED_BYTES, s.bytes - s.freed_bytes),
                (TEMPORARIES, s.temporaries),
                (PEAK_BYTES, s.peak_bytes),
                (LEAKED_AGE, s.leaked_age_us),
            ] {
                values[index(kind)] = value;
            }
            for &(k, n) in s.sizes {
                values[index(&format!("{SIZE_BUCKET}{k}"))] = n;
            }
            for &(k, n) in s.lifetimes {
                values[index(&format!("{LIFETIME_BUCKET}{k}"))] = n;
            }
            Sample {
                probe: 0,
                pid,
                stack: vec![0, site, 4, 5],
                truncated: None,
                values,
            }
        };
        let samples = vec![
            sample(
                42,
                1,
                HeapSite {
                    allocs: 200,
                    bytes: 200 * 1013,
                    frees: 50,
                    freed_bytes: 50 * 1013,
                    temporaries: 0,
                    peak_bytes: 200 * 1013,
                    leaked_age_us: 150 * 1_200_000,
                    sizes: &[(10, 200)],
                    lifetimes: &[(30, 50)],
                },
            ),
            sample(
                42,
                2,
                HeapSite {
                    allocs: 1000,
                    bytes: 64_000,
                    frees: 1000,
                    freed_bytes: 64_000,
                    temporaries: 990,
                    peak_bytes: 640,
                    leaked_age_us: 0,
                    sizes: &[(7, 1000)],
                    lifetimes: &[(10, 990), (21, 10)],
                },
            ),
            sample(
                43,
                3,
                HeapSite {
                    allocs: 12,
                    bytes: 10 * 16 + 2 * 4096,
                    frees: 10,
                    freed_bytes: 160,
                    temporaries: 0,
                    peak_bytes: 8352,
                    leaked_age_us: 2 * 300_000,
                    sizes: &[(5, 10), (13, 2)],
                    lifetimes: &[(25, 10)],
                },
            ),
        ];
        let process = |pid, allocs, bytes, frees, freed_bytes, peak_bytes| HeapProcess {
            probe: 0,
            pid,
            allocs,
            bytes,
            frees,
            freed_bytes,
            live_bytes: bytes as i64 - freed_bytes as i64,
            peak_bytes,
            unknown_frees: 0,
        };
        let mut profile = example();
        Profile {
            value_types,
            probes: vec!["alloc".into()],
            samples,
            locations,
            heap: Some(HeapTotals {
                processes: vec![
                    process(42, 1200, 266_600, 1050, 114_650, 203_240),
                    process(43, 12, 8352, 10, 160, 8352),
                ],
                temporary_threshold: Duration::from_millis(1),
                ..HeapTotals::default()
            }),
            summary: Summary::default(),
            metadata: Metadata {
                command: Some(vec!["./leaky".into()]),
                executable: Some("/work/demo".into()),
                period: None,
                timeline: Vec::new(),
                ..std::mem::take(&mut profile.metadata)
            },
            ..profile
        }
    }

    /// Compares `actual` with the golden file `name`, or rewrites it with `UPDATE_GOLDEN=1`.
    pub(crate) fn golden(name: &str, actual: &[u8]) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, actual).unwrap();
            return;
        }
        let expected = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert!(
            expected == actual,
            "{} differs from the writer's output:\n{}",
            path.display(),
            String::from_utf8_lossy(actual)
        );
    }

    fn written(write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        out
    }

    #[test]
    fn folded_by_events_and_by_bytes() {
        let profile = example();
        let events = Weighting::default();
        golden(
            "example.folded",
            &written(|out| folded::write(&profile, events, out)),
        );
        let bytes = Weighting {
            value: 1,
            line_numbers: true,
        };
        golden(
            "example-bytes-lines.folded",
            &written(|out| folded::write(&profile, bytes, out)),
        );
    }

    #[test]
    fn svg() {
        let profile = example();
        let svg = written(|out| svg::write(&profile, Weighting::default(), "example", out));
        golden("example.svg", &svg);
        let text = String::from_utf8(svg).unwrap();
        assert!(text.contains("demo::inlined_helper") && text.contains("(11 events, 100%)"));
    }

    #[test]
    fn svg_of_nothing_says_so() {
        let mut profile = example();
        profile.samples.clear();
        let svg = written(|out| svg::write(&profile, Weighting::default(), "t", out));
        assert!(String::from_utf8(svg).unwrap().contains("no events"));
    }

    /// The heap example through every writer of text, weighed by the bytes allocated.
    #[test]
    fn heap_profile_goldens() {
        let profile = heap_example();
        let bytes = Weighting {
            value: profile.value_index(crate::heap::ALLOC_SPACE).unwrap(),
            line_numbers: false,
        };
        golden(
            "heap.folded",
            &written(|out| folded::write(&profile, bytes, out)),
        );
        golden(
            "heap.svg",
            &written(|out| svg::write(&profile, bytes, "heap example", out)),
        );
        golden("heap.json", &written(|out| json::write(&profile, out)));
        golden("heap.csv", &written(|out| csv::write(&profile, bytes, out)));
        golden(
            "heap.timeline.csv",
            &written(|out| csv::write_timeline(&profile, out)),
        );
        golden(
            "heap.report.txt",
            &written(|out| heap_report::write(&profile, crate::heap::OrderBy::Bytes, out)),
        );
        golden("heap.summary.txt", {
            let mut text = summary::line(&profile);
            for note in summary::notes(&profile) {
                text.push('\n');
                text.push_str(&note);
            }
            text.push('\n');
            &text.into_bytes()
        });
    }

    #[test]
    fn summary_line() {
        let profile = example();
        assert_eq!(
            summary::line(&profile),
            "cargo-trace: 11 events, 5 distinct stacks in 1.50 s; walk failures: read fault 2; \
             losses and limits: known stacks full 3 (--max-stacks), hash collision 1"
        );
        let mut complete = profile;
        complete.summary.failures.clear();
        complete.summary.losses = vec![
            lost("stack ring full", 4, &["--ring-buffer-mib"]),
            lost("count lost", 2, &["--max-counts", "--ring-buffer-mib"]),
            lost("file map full", 5, &["--max-files"]),
        ];
        complete.summary.in_exec = 3;
        complete.summary.not_the_targets = 1;
        complete.samples[1].pid = 7;
        assert_eq!(
            summary::line(&complete),
            "cargo-trace: 11 events, 5 distinct stacks from 2 processes in 1.50 s; \
             every stack walk reached the end of the stack; \
             losses and limits: stack ring full 4 (--ring-buffer-mib), \
             count lost 2 (--max-counts or --ring-buffer-mib), file map full 5 (--max-files); \
             3 in execve with no user stack left to walk (kernel stack only); \
             1 taken in cargo-trace's entry breakpoint, not counted"
        );
    }
}
