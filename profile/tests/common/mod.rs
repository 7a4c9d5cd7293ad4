//! Profiles of any size, made with the model's types (no BPF, no process): an
//! interpreter's stacks, as deep and as many as asked, CPU or heap. For tests of the
//! writers at real sizes (`generate::interpreter(100_000, 500, Kind::Heap)`).

#![allow(dead_code)]

pub mod browser;

use std::time::Duration;

use profile::heap;
use profile::{
    Frame, HeapPoint, HeapProcess, HeapTotals, Location, Mapping, Metadata, Profile, Sample,
    Summary, TimelinePoint, ValueType,
};

/// What a generated profile counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Clock samples: `samples` and `cpu` (99 Hz).
    Cpu,
    /// The heap's values (`heap::value_types`), leaks, histograms and memory over time.
    Heap,
}

/// The interpreter's start, as CPython 3.11's: every stack begins with these.
const START: [&str; 11] = [
    "_start",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "main",
    "Py_BytesMain",
    "pymain_run_python",
    "_PyRun_AnyFileObject",
    "_PyRun_SimpleFileObject",
    "run_mod",
    "run_eval_code_obj",
    "PyEval_EvalCode",
];

/// One level of the interpreter's recursion (a Python call through a C function).
const RECURSION: [&str; 4] = [
    "_PyEval_EvalFrameDefault",
    "PyObject_Vectorcall",
    "encoder_listencode_obj",
    "encoder_listencode_dict",
];

/// The C functions a branch of the stacks goes through, one per digit.
const BRANCHES: [&str; 10] = [
    "list_append",
    "dict_ass_sub",
    "unicode_concatenate",
    "long_add",
    "tuple_new_impl",
    "bytes_join",
    "set_add_entry",
    "float_repr",
    "scanstring_unicode",
    "_json_loads",
];

/// The allocator's end of every stack, innermost last.
const ALLOCATOR: [&str; 3] = ["PyObject_Malloc", "_PyObject_Malloc", "malloc"];

/// Frames of each branch level: a Python call (two frames) and the C function.
const LEVEL: usize = 3;

/// The 99 Hz period, in nanoseconds.
const PERIOD: i64 = 10_101_010;

/// How the stacks of a generated profile differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// As an interpreter's: a deep recursion they share, then branches (ten at each
    /// level, as many levels as the stacks need).
    Tree,
    /// Below the interpreter's start, each frame a function drawn at random among this
    /// many: stacks that share almost nothing, the largest tree of their frames.
    Scattered(usize),
}

/// `stacks` distinct stacks of `depth` frames each, as an interpreter's: a common start
/// (`_start` … `Py_BytesMain` …), a deep recursion they share, then branches (ten at
/// each level, as many levels as `stacks` needs) and the allocator. Locations are one
/// per function (`malloc` and `__libc_*` in libc, the rest in python3.11).
pub fn interpreter(stacks: usize, depth: usize, kind: Kind) -> Profile {
    interpreter_shaped(stacks, depth, kind, Shape::Tree)
}

/// As [`interpreter`], with stacks of `shape`.
pub fn interpreter_shaped(stacks: usize, depth: usize, kind: Kind, shape: Shape) -> Profile {
    let levels = digits(stacks.max(1));
    let fixed = START.len() + levels * LEVEL + ALLOCATOR.len();
    assert!(
        depth >= fixed,
        "{stacks} stacks need at least {fixed} frames each"
    );
    let mappings = vec![
        Mapping {
            start: 0x5555_5555_0000,
            end: 0x5555_5600_0000,
            file_offset: 0,
            path: "/usr/bin/python3.11".into(),
            build_id: Some("a3c1".into()),
        },
        Mapping {
            start: 0x7fff_f7c0_0000,
            end: 0x7fff_f7e0_0000,
            file_offset: 0x28000,
            path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            build_id: None,
        },
    ];
    let mut locations: Vec<Location> = Vec::new();
    let mut ids: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut location = |function: &str| -> usize {
        if let Some(&id) = ids.get(function) {
            return id;
        }
        let mapping = usize::from(function == "malloc" || function.starts_with("__libc"));
        locations.push(Location {
            address: mappings[mapping].start + 0x40 * locations.len() as u64,
            mapping: Some(mapping),
            frames: vec![Frame::named(function.to_string())],
            kernel: false,
        });
        ids.insert(function.to_string(), locations.len() - 1);
        locations.len() - 1
    };
    // The part every stack shares, outermost first.
    let mut shared: Vec<usize> = START.iter().map(|f| location(f)).collect();
    while shared.len() < depth - (fixed - START.len()) {
        shared.push(location(
            RECURSION[(shared.len() - START.len()) % RECURSION.len()],
        ));
    }
    let allocator: Vec<usize> = ALLOCATOR.iter().map(|f| location(f)).collect();
    let value_types = match kind {
        Kind::Cpu => vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        Kind::Heap => heap::value_types(),
    };
    let index = |kind: &str| value_types.iter().position(|t| t.kind == kind);
    let mut samples = Vec::with_capacity(stacks);
    let mut random = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..stacks {
        // Outermost first, then reversed: the model's stacks are innermost first.
        let mut stack = match shape {
            Shape::Tree => shared.clone(),
            Shape::Scattered(_) => shared[..START.len()].to_vec(),
        };
        match shape {
            Shape::Tree => {
                let mut rest = i;
                for _ in 0..levels {
                    let digit = rest % 10;
                    rest /= 10;
                    stack.push(location(RECURSION[0]));
                    stack.push(location(RECURSION[1]));
                    stack.push(location(BRANCHES[digit]));
                }
            }
            Shape::Scattered(functions) => {
                while stack.len() < depth - ALLOCATOR.len() {
                    // xorshift: the same profile every run.
                    random ^= random << 13;
                    random ^= random >> 7;
                    random ^= random << 17;
                    let function = random % functions.max(1) as u64;
                    stack.push(location(&format!("py_function_{function}")));
                }
            }
        }
        stack.extend(&allocator);
        stack.reverse();
        debug_assert_eq!(stack.len(), depth);
        let mut values = vec![0i64; value_types.len()];
        match kind {
            Kind::Cpu => {
                let samples = 1 + (i * 7_919 % 13) as i64;
                values[0] = samples;
                values[1] = samples * PERIOD;
            }
            Kind::Heap => heap_values(i, &mut values, &index),
        }
        samples.push(Sample {
            probe: 0,
            pid: if i % 10 == 9 { 4_243 } else { 4_242 },
            stack,
            truncated: None,
            values,
        });
    }
    let duration = Duration::from_millis(240);
    let events: i64 = samples.iter().map(|s| s.values[0]).sum();
    let mut profile = Profile {
        value_types,
        probes: vec![match kind {
            Kind::Cpu => "profile:hz:99".to_string(),
            Kind::Heap => "alloc".to_string(),
        }],
        samples,
        locations,
        mappings,
        summary: Summary::default(),
        metadata: Metadata {
            command: Some(vec!["python3".into(), "roundtrip.py".into()]),
            pid: 4_242,
            executable: Some("/usr/bin/python3.11".into()),
            started: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            duration,
            period: (kind == Kind::Cpu).then(|| (ValueType::new("cpu", "nanoseconds"), PERIOD)),
            // A 0.24 s run: one count at 200 ms, one at the end.
            timeline: vec![
                TimelinePoint {
                    at: Duration::from_millis(200),
                    walks: events as u64 * 5 / 6,
                },
                TimelinePoint {
                    at: duration,
                    walks: events as u64,
                },
            ],
        },
        heap: None,
    };
    if kind == Kind::Heap {
        profile.heap = Some(heap_totals(&profile, duration));
    }
    profile
}

/// The decimal digits of `n - 1` (the levels of ten branches that `n` stacks need).
fn digits(n: usize) -> usize {
    let mut levels = 1;
    let mut reach = 10;
    while reach < n {
        reach *= 10;
        levels += 1;
    }
    levels
}

/// Stack `i`'s heap values: a few allocations of one size, most freed, some soon
/// (temporaries); one stack in 97 leaks.
fn heap_values(i: usize, values: &mut [i64], index: &dyn Fn(&str) -> Option<usize>) {
    let allocs = 1 + (i % 17) as i64;
    let size = 16i64 << (i % 9);
    let leaked = if i.is_multiple_of(97) {
        1 + (i % 3) as i64
    } else {
        0
    };
    let frees = allocs - leaked.min(allocs);
    let mut set = |kind: &str, value: i64| {
        values[index(kind).expect("a heap value")] += value;
    };
    set(heap::ALLOCS, allocs);
    set(heap::ALLOC_SPACE, allocs * size);
    set(heap::FREES, frees);
    set(heap::FREED_SPACE, frees * size);
    set(heap::LEAKED_BLOCKS, allocs - frees);
    set(heap::LEAKED_BYTES, (allocs - frees) * size);
    set(heap::TEMPORARIES, frees / 2);
    set(heap::PEAK_BYTES, if i.is_multiple_of(5) { size } else { 0 });
    set(heap::LEAKED_AGE, (allocs - frees) * 180_000);
    let size_bucket = 64 - size.leading_zeros() as usize;
    set(&format!("{}{size_bucket}", heap::SIZE_BUCKET), allocs);
    let short = frees / 2;
    set(&format!("{}{}", heap::LIFETIME_BUCKET, 10 + i % 6), short);
    set(
        &format!("{}{}", heap::LIFETIME_BUCKET, 24 + i % 4),
        frees - short,
    );
}

/// Each process's totals from its samples, and memory over time every 100 ms.
fn heap_totals(profile: &Profile, duration: Duration) -> HeapTotals {
    let at = |kind: &str| profile.value_index(kind).expect("a heap value");
    let (allocs, bytes, frees, freed, leaked, peak) = (
        at(heap::ALLOCS),
        at(heap::ALLOC_SPACE),
        at(heap::FREES),
        at(heap::FREED_SPACE),
        at(heap::LEAKED_BYTES),
        at(heap::PEAK_BYTES),
    );
    let mut processes: Vec<HeapProcess> = Vec::new();
    for sample in &profile.samples {
        let process = match processes.iter_mut().find(|p| p.pid == sample.pid) {
            Some(process) => process,
            None => {
                processes.push(HeapProcess {
                    pid: sample.pid,
                    ..HeapProcess::default()
                });
                processes.last_mut().expect("just pushed")
            }
        };
        let v = &sample.values;
        process.allocs += v[allocs] as u64;
        process.bytes += v[bytes] as u64;
        process.frees += v[frees] as u64;
        process.freed_bytes += v[freed] as u64;
        process.live_bytes += v[leaked];
        process.peak_bytes += v[peak];
    }
    let all_allocs: u64 = processes.iter().map(|p| p.allocs).sum();
    let all_frees: u64 = processes.iter().map(|p| p.frees).sum();
    let end: i64 = processes.iter().map(|p| p.live_bytes).sum();
    let top: i64 = processes.iter().map(|p| p.peak_bytes).sum();
    let steps = (duration.as_millis() / 100) as u64 + 1;
    let timeline = (0..=steps)
        .map(|step| {
            let at = (Duration::from_millis(100 * step)).min(duration);
            let part = |n: u64| n * step / steps;
            let live = if step * 2 <= steps {
                top * step as i64 * 2 / steps as i64
            } else {
                end + (top - end) * (steps - step) as i64 * 2 / steps as i64
            };
            HeapPoint {
                at,
                live_bytes: live,
                allocs: part(all_allocs),
                frees: part(all_frees),
                rss_bytes: (24 << 20) + part(8 << 20),
            }
        })
        .collect();
    HeapTotals {
        processes,
        temporary_threshold: Duration::from_millis(1),
        timeline,
        ..HeapTotals::default()
    }
}
