//! The heap profile's pprof output as `go tool pprof` reads it: Go's heap convention
//! (`inuse_space` by default, `alloc_space` on request), the leaked and allocated bytes
//! exact at the fixture's site, at most twelve sample types. The golden file of the
//! writer's hand-made heap profile is read the same way, without BPF.

mod common;

use std::path::{Path, PathBuf};

use cargo_trace_tests::expected;
use cargo_trace_tests::fixtures;
use cargo_trace_tests::pprof::{self, text};
use common::go_pprof::{self, top_row};
use common::{bpf_available, quoted, trace};

/// Go's heap sample types, first in every heap profile.
const GO_HEAP: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

/// The sample types of a pprof file, and its default.
fn sample_types(file: &Path) -> (Vec<(String, String)>, String) {
    let profile = pprof::read(file);
    let types = profile
        .sample_type
        .iter()
        .map(|t| {
            (
                text(&profile, t.r#type).to_string(),
                text(&profile, t.unit).to_string(),
            )
        })
        .collect();
    (
        types,
        text(&profile, profile.default_sample_type).to_string(),
    )
}

fn check_go_convention(file: &Path) {
    let (types, default) = sample_types(file);
    assert!(types.len() <= 12, "{} sample types: {types:?}", types.len());
    let first: Vec<(&str, &str)> = types[..4]
        .iter()
        .map(|(t, u)| (t.as_str(), u.as_str()))
        .collect();
    assert_eq!(first, GO_HEAP);
    assert_eq!(default, "inuse_space");
}

/// `go tool pprof -top` of `file` in exact bytes, by `sample_index` (none: the file's
/// default).
fn top_in_bytes(file: &Path, sample_index: Option<&str>) -> String {
    let index = sample_index.map(|index| format!("-sample_index={index}"));
    let mut args = vec!["-top", "-unit=B"];
    args.extend(index.as_deref());
    go_pprof::run(&args, file)
}

#[test]
fn the_golden_heap_profile_in_go_tool_pprof() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profile/tests/data/heap-example.pb.gz");
    check_go_convention(&file);
    if !go_pprof::available() {
        return;
    }
    // The writer's heap example: leak_site leaks 150 blocks of 1013 bytes of its 200;
    // mixed_sizes, in another process, 2 of 4096.
    let inuse = top_in_bytes(&file, Some("inuse_space"));
    assert!(inuse.contains("Type: inuse_space"), "{inuse}");
    assert_eq!(top_row(&inuse, "leak_site").cum, "151950B", "{inuse}");
    assert_eq!(top_row(&inuse, "mixed_sizes").cum, "8192B", "{inuse}");
    assert!(
        !inuse.contains(" churn\n"),
        "churn freed everything:\n{inuse}"
    );
    // pprof's default is the file's: in use.
    assert!(top_in_bytes(&file, None).contains("Type: inuse_space"));
    let alloc = top_in_bytes(&file, Some("alloc_space"));
    assert_eq!(top_row(&alloc, "leak_site").cum, "202600B", "{alloc}");
    assert_eq!(top_row(&alloc, "churn").cum, "64000B", "{alloc}");
    let objects = go_pprof::run(&["-top", "-sample_index=inuse_objects"], &file);
    assert_eq!(top_row(&objects, "leak_site").cum, "150", "{objects}");
    // The block sizes as Go's `bytes` label: pprof's tag view lists them.
    let tags = go_pprof::run(&["-tags", "-sample_index=alloc_objects"], &file);
    for size in ["1013B", "64B", "696B"] {
        assert!(tags.contains(size), "no block size {size} in:\n{tags}");
    }
}

/// `cargo trace alloc --pprof` of a fixture that leaks 200 of its 250 blocks of 1013
/// bytes: pprof shows exactly the leaked bytes at the site in use, the allocated bytes
/// allocated.
#[test]
fn a_leak_in_go_tool_pprof() {
    if !bpf_available("heap pprof") {
        return;
    }
    let fixture = fixtures::c_fixture("exit_leak");
    let run = trace(
        "heap-pprof",
        &["alloc"],
        &quoted(&fixture),
        &["--pprof", "heap.pb.gz"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    let [site] = &sites[..] else {
        panic!("one site expected: {}", run.stdout);
    };
    let file = run.scratch.path("heap.pb.gz");
    check_go_convention(&file);

    // Our own decoder: the site's samples carry its block size.
    let profile = pprof::read(&file);
    let sizes: Vec<i64> = profile
        .sample
        .iter()
        .flat_map(|s| &s.label)
        .filter(|l| text(&profile, l.key) == "bytes")
        .map(|l| l.num)
        .collect();
    assert!(sizes.contains(&(site.size as i64)), "{sizes:?}");

    if !go_pprof::available() {
        return;
    }
    let function = &site.function;
    let inuse = top_in_bytes(&file, Some("inuse_space"));
    assert_eq!(
        top_row(&inuse, function).cum,
        format!("{}B", site.leaked * site.size),
        "{inuse}"
    );
    let alloc = top_in_bytes(&file, Some("alloc_space"));
    assert_eq!(
        top_row(&alloc, function).cum,
        format!("{}B", site.bytes),
        "{alloc}"
    );
    let objects = go_pprof::run(&["-top", "-sample_index=inuse_objects"], &file);
    assert_eq!(
        top_row(&objects, function).cum,
        site.leaked.to_string(),
        "{objects}"
    );
}
