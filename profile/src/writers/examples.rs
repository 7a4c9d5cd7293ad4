//! Example profiles for the writers' tests and golden files, beside the CPU example of
//! `writers::tests::example`: [`heap`], a heap profile of an interpreter, and
//! [`HeapStack`] to make others like it.

use std::time::Duration;

use crate::heap::{self, BUCKETS};
use crate::{
    Frame, HeapPoint, HeapProcess, HeapTotals, Location, Mapping, Metadata, Profile, Sample,
    Summary, TimelinePoint,
};

/// One stack of a heap profile and what it did.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeapStack {
    /// Functions, innermost (the allocator) first.
    pub frames: &'static [&'static str],
    pub pid: u32,
    pub truncated: Option<&'static str>,
    pub allocs: i64,
    /// Each allocation's size: every block of a stack here is of one size.
    pub size: i64,
    pub frees: i64,
    pub temporaries: i64,
    /// Bytes live when the process's live bytes peaked.
    pub peak_bytes: i64,
    /// Mean age of the blocks left at the end.
    pub leaked_age: Duration,
    /// Frees by bucket of lifetime (bit length of nanoseconds).
    pub lifetimes: &'static [(usize, i64)],
}

impl HeapStack {
    /// The sample's values, in the order of [`heap::value_types`].
    fn values(&self) -> Vec<i64> {
        let kinds = heap::value_types();
        let mut values = vec![0; kinds.len()];
        let leaked = self.allocs - self.frees;
        let mut set = |kind: &str, value: i64| {
            let index = kinds
                .iter()
                .position(|t| t.kind == kind)
                .expect("a heap kind");
            values[index] += value;
        };
        set(heap::ALLOCS, self.allocs);
        set(heap::ALLOC_SPACE, self.allocs * self.size);
        set(heap::FREES, self.frees);
        set(heap::FREED_SPACE, self.frees * self.size);
        set(heap::LEAKED_BLOCKS, leaked);
        set(heap::LEAKED_BYTES, leaked * self.size);
        set(heap::TEMPORARIES, self.temporaries);
        set(heap::PEAK_BYTES, self.peak_bytes);
        set(
            heap::LEAKED_AGE,
            leaked * self.leaked_age.as_micros() as i64,
        );
        let size_bucket = (64 - self.size.max(0).leading_zeros() as usize).min(BUCKETS - 1);
        set(&format!("{}{size_bucket}", heap::SIZE_BUCKET), self.allocs);
        for &(bucket, frees) in self.lifetimes {
            set(&format!("{}{bucket}", heap::LIFETIME_BUCKET), frees);
        }
        values
    }
}

/// A heap profile built of `stacks`: their functions as locations of one executable
/// (functions named like libc's in libc), every process's totals the sums of its
/// stacks, its peak `peaks` gives (pid → bytes), and `timeline` as memory over time.
pub(crate) fn heap_profile(
    stacks: &[HeapStack],
    peaks: &[(u32, i64)],
    timeline: Vec<HeapPoint>,
    duration: Duration,
) -> Profile {
    let mappings = vec![
        Mapping {
            start: 0x5555_5555_0000,
            end: 0x5555_5600_0000,
            file_offset: 0,
            path: "/usr/bin/python3.11".into(),
            build_id: Some("4f2a".into()),
        },
        Mapping {
            start: 0x7fff_f7c0_0000,
            end: 0x7fff_f7e0_0000,
            file_offset: 0x28000,
            path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            build_id: None,
        },
    ];
    let in_libc = [
        "malloc",
        "calloc",
        "realloc",
        "__libc_start_call_main",
        "__libc_start_main_impl",
    ];
    let mut locations: Vec<Location> = Vec::new();
    let mut location_of = |function: &str| -> usize {
        if let Some(index) = locations
            .iter()
            .position(|l| l.frames[0].function == function)
        {
            return index;
        }
        let mapping = usize::from(in_libc.contains(&function));
        locations.push(Location {
            address: mappings[mapping].start + 0x100 * locations.len() as u64,
            mapping: Some(mapping),
            frames: vec![Frame::named(function.to_string())],
            kernel: false,
        });
        locations.len() - 1
    };
    let samples: Vec<Sample> = stacks
        .iter()
        .map(|stack| Sample {
            probe: 0,
            pid: stack.pid,
            stack: stack.frames.iter().map(|f| location_of(f)).collect(),
            truncated: stack.truncated.map(str::to_string),
            values: stack.values(),
        })
        .collect();
    let mut pids: Vec<u32> = stacks.iter().map(|s| s.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let processes = pids
        .iter()
        .map(|&pid| {
            let of = stacks.iter().filter(|s| s.pid == pid);
            let sum = |f: &dyn Fn(&HeapStack) -> i64| of.clone().map(f).sum::<i64>();
            HeapProcess {
                probe: 0,
                pid,
                allocs: sum(&|s| s.allocs) as u64,
                bytes: sum(&|s| s.allocs * s.size) as u64,
                frees: sum(&|s| s.frees) as u64,
                freed_bytes: sum(&|s| s.frees * s.size) as u64,
                live_bytes: sum(&|s| (s.allocs - s.frees) * s.size),
                peak_bytes: peaks
                    .iter()
                    .find(|(p, _)| *p == pid)
                    .map_or(0, |(_, peak)| *peak),
                unknown_frees: 0,
            }
        })
        .collect();
    let walks: u64 = stacks.iter().map(|s| (s.allocs + s.frees) as u64).sum();
    Profile {
        value_types: heap::value_types(),
        probes: vec!["alloc".into()],
        samples,
        locations,
        mappings,
        summary: Summary::default(),
        metadata: Metadata {
            command: Some(vec!["python3".into(), "roundtrip.py".into()]),
            pid: pids.first().copied().unwrap_or(0),
            executable: Some("/usr/bin/python3.11".into()),
            started: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            duration,
            period: None,
            timeline: vec![TimelinePoint {
                at: duration,
                walks,
            }],
        },
        heap: Some(HeapTotals {
            processes,
            temporary_threshold: Duration::from_millis(1),
            timeline,
            ..HeapTotals::default()
        }),
    }
}

/// The interpreter's frames above its own allocations.
const INTERPRETER: [&str; 8] = [
    "_PyEval_EvalFrameDefault",
    "PyEval_EvalCode",
    "run_mod",
    "pymain_run_python",
    "Py_BytesMain",
    "main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
];

/// A heap profile of an interpreter: strings allocated and freed soon (temporaries),
/// lists that leak 3.4 MiB in 104 blocks, a stack cut short, a child process; memory over
/// time every 100 ms.
pub(crate) fn heap() -> Profile {
    const STRINGS: [&str; 11] = with_interpreter(["malloc", "PyUnicode_New", "json_encode"]);
    const LISTS: [&str; 11] = with_interpreter(["malloc", "list_resize", "json_decode"]);
    const DICTS: [&str; 11] = with_interpreter(["realloc", "dictresize", "json_decode"]);
    let stacks = [
        HeapStack {
            frames: &STRINGS,
            pid: 42,
            allocs: 1_000,
            size: 2_100,
            frees: 1_000,
            temporaries: 800,
            peak_bytes: 210_000,
            lifetimes: &[(20, 800), (27, 200)],
            ..HeapStack::default()
        },
        HeapStack {
            frames: &LISTS,
            pid: 42,
            allocs: 150,
            size: 34_304,
            frees: 46,
            peak_bytes: 3_567_616,
            leaked_age: Duration::from_millis(1_200),
            lifetimes: &[(24, 46)],
            ..HeapStack::default()
        },
        HeapStack {
            frames: &DICTS,
            pid: 42,
            allocs: 600,
            size: 640,
            frees: 600,
            temporaries: 120,
            peak_bytes: 64_000,
            lifetimes: &[(19, 120), (26, 480)],
            ..HeapStack::default()
        },
        HeapStack {
            frames: &["malloc", "PyObject_Malloc"],
            pid: 42,
            truncated: Some("read fault"),
            allocs: 60,
            size: 48,
            frees: 60,
            temporaries: 60,
            lifetimes: &[(10, 60)],
            ..HeapStack::default()
        },
        HeapStack {
            frames: &STRINGS,
            pid: 43,
            allocs: 40,
            size: 2_100,
            frees: 40,
            peak_bytes: 84_000,
            lifetimes: &[(22, 40)],
            ..HeapStack::default()
        },
    ];
    let timeline = (0..=15u32)
        .map(|tenth| {
            let at = Duration::from_millis(100 * u64::from(tenth));
            // Up to the peak at 1.0 s, then down to what leaks.
            let live = if tenth <= 10 {
                i64::from(tenth) * 392_600
            } else {
                3_926_000 - i64::from(tenth - 10) * 71_600
            };
            HeapPoint {
                at,
                live_bytes: live,
                allocs: u64::from(tenth) * 123,
                frees: u64::from(tenth) * 116,
                rss_bytes: 9 << 20 | (u64::from(tenth) * 250_000),
            }
        })
        .collect();
    heap_profile(
        &stacks,
        &[(42, 3_926_000), (43, 84_000)],
        timeline,
        Duration::from_millis(1_500),
    )
}

/// `leaf` and the interpreter's frames above it.
const fn with_interpreter(leaf: [&'static str; 3]) -> [&'static str; 11] {
    let mut frames = [""; 11];
    let mut i = 0;
    while i < 3 {
        frames[i] = leaf[i];
        i += 1;
    }
    while i < 11 {
        frames[i] = INTERPRETER[i - 3];
        i += 1;
    }
    frames
}
