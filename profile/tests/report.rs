//! The HTML report at real sizes, read by real browsers (issue 25): generated
//! interpreter profiles (the model's types, no BPF) of 100 k distinct stacks of 500
//! frames, and one of the size of the CPython run (1,504 stacks of 300 frames);
//! each report's size; printed to PDF by headless Chromium, the text it drew
//! (`pdftotext`): every printed flamegraph shows the interpreter's frames
//! (`Py_BytesMain`), and every view its content; in Firefox, where it is installed,
//! the same views drawn.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::browser::{Chromium, Firefox, Reading, SEARCH};
use common::{interpreter, interpreter_shaped, Kind, Shape};
use profile::writers::{html, Options, Weighting};
use profile::Profile;

/// The bound for the report of its CPython run.
const CPYTHON_REPORT_MAX: u64 = 5 << 20;

/// Writes the report of `profile` into `directory`: its path, size and writing time.
fn report(profile: &Profile, directory: &Path, name: &str) -> (PathBuf, u64, Duration) {
    let path = directory.join(name);
    let started = Instant::now();
    let mut out = Vec::new();
    let options = Options {
        weighting: Weighting::default(),
        title: format!("python3 roundtrip.py ({name})"),
        ..Options::default()
    };
    html::write(profile, &options, &mut out).expect("write the report");
    let took = started.elapsed();
    std::fs::write(&path, &out).expect("save the report");
    (path, out.len() as u64, took)
}

fn megabytes(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// The printed text of each flamegraph section (from its heading to the next heading
/// of a section), by value name.
fn printed_flamegraphs(text: &str) -> Vec<(String, String)> {
    let mut sections = Vec::new();
    let mut parts = text.split("Flamegraph: ").skip(1).peekable();
    while let Some(part) = parts.next() {
        let (title, body) = part.split_once('\n').unwrap_or((part, ""));
        // The last one ends where the next section starts.
        let body = if parts.peek().is_none() {
            body.split("\nMemory over time\n")
                .next()
                .unwrap_or(body)
                .split("\nEvents over time\n")
                .next()
                .unwrap_or(body)
        } else {
            body
        };
        sections.push((title.trim().to_string(), body.to_string()));
    }
    sections
}

/// Chromium prints every flamegraph with the interpreter's frames in it, and every
/// view with its words; its DOM has no view that failed.
fn check_in_chromium(chromium: &Chromium, page: &Path, flamegraphs: &[&str], words: &[&str]) {
    let (text, took) = chromium.printed_text(page);
    eprintln!(
        "  printed to PDF by chromium in {:.2} s: {} characters of text",
        took.as_secs_f64(),
        text.len()
    );
    let printed = printed_flamegraphs(&text);
    let titles: Vec<&str> = printed.iter().map(|(title, _)| title.as_str()).collect();
    assert_eq!(titles, flamegraphs, "the printed flamegraphs");
    for (title, body) in &printed {
        assert!(
            body.contains("Py_BytesMain") && body.contains("_PyEval_EvalFrameDefault"),
            "the flamegraph of {title} shows no interpreter frame: {}",
            &body[..body.len().min(2000)]
        );
    }
    for word in words {
        assert!(text.contains(word), "the printed report lacks {word:?}");
    }
    assert!(
        !text.contains("could not be drawn"),
        "a view failed: {text}"
    );

    let (dom, took) = chromium.dom(page);
    let drawn = dom
        .split("data-drawn-ms=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the script did not finish: {}", &dom[..dom.len().min(3000)]));
    eprintln!(
        "  loaded by chromium in {:.2} s (its script drew every view in {drawn} ms)",
        took.as_secs_f64()
    );
    // What the script drew (the script itself names the failure it would show).
    let dom = dom.split("<script").next().unwrap_or(&dom);
    assert!(!dom.contains("could not be drawn"), "a view failed: {dom}");
    let flame = dom.split("id=\"flame\"").nth(1).expect("the flamegraph");
    assert!(flame.contains("<rect ") && flame.contains(">Py_BytesMain</text>"));
}

#[test]
fn a_heap_report_of_100k_stacks_of_500_frames() {
    let scratch = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let profile = interpreter(100_000, 500, Kind::Heap);
    let generated = started.elapsed();
    let (page, size, took) = report(&profile, scratch.path(), "heap-100k.html");
    eprintln!(
        "heap report of 100,000 stacks of 500 frames: {} (generated in {:.2} s, written in {:.2} s)",
        megabytes(size),
        generated.as_secs_f64(),
        took.as_secs_f64()
    );
    assert!(size < 16 << 20, "{} is too large", megabytes(size));
    let Some(chromium) = Chromium::find() else {
        return;
    };
    check_in_chromium(
        &chromium,
        &page,
        &[
            "allocations",
            "bytes allocated",
            "frees",
            "leaked bytes",
            "temporary allocations",
            "bytes live at the peak",
        ],
        &[
            "Memory over time",
            "The stacks that hold the most",
            "leaked in",
            "mean age",
            "by size (in powers of two)",
            "by how long they lived",
            "split by process",
            "pid 4243",
            "Callers and callees",
            "Top-down",
            "Bottom-up",
        ],
    );
}

#[test]
fn a_cpu_report_of_100k_stacks_of_500_frames() {
    let scratch = tempfile::tempdir().unwrap();
    let profile = interpreter(100_000, 500, Kind::Cpu);
    let (page, size, took) = report(&profile, scratch.path(), "cpu-100k.html");
    eprintln!(
        "CPU report of 100,000 stacks of 500 frames: {} (written in {:.2} s)",
        megabytes(size),
        took.as_secs_f64()
    );
    assert!(size < 8 << 20, "{} is too large", megabytes(size));
    let Some(chromium) = Chromium::find() else {
        return;
    };
    check_in_chromium(
        &chromium,
        &page,
        &["samples", "CPU time"],
        &[
            // The 0.24 s run's two counts, on an axis in milliseconds.
            "stack walks in 240 ms, counted 2 times",
            "200 ms",
            "split by process",
            "pid 4242",
        ],
    );
}

/// The largest report of the CPython run could be: its 1,504 stacks of 300
/// frames sharing nothing but the interpreter's start (every frame one of 5,000
/// functions, at random).
#[test]
fn the_report_of_1504_stacks_that_share_nothing_is_under_5_mb() {
    let scratch = tempfile::tempdir().unwrap();
    let profile = interpreter_shaped(1_504, 300, Kind::Heap, Shape::Scattered(5_000));
    let (page, size, _) = report(&profile, scratch.path(), "heap-scattered.html");
    eprintln!(
        "heap report of 1,504 stacks of 300 frames sharing nothing: {}",
        megabytes(size)
    );
    assert!(size <= CPYTHON_REPORT_MAX, "{}", megabytes(size));
    let Some(chromium) = Chromium::find() else {
        return;
    };
    let (text, _) = chromium.printed_text(&page);
    let printed = printed_flamegraphs(&text);
    assert_eq!(printed.len(), 6, "{text}");
    for (title, body) in printed {
        assert!(body.contains("Py_BytesMain"), "{title}: {body}");
    }
}

#[test]
fn the_report_of_a_cpython_sized_run_is_under_5_mb() {
    let scratch = tempfile::tempdir().unwrap();
    let profile = interpreter(1_504, 300, Kind::Heap);
    let (page, size, _) = report(&profile, scratch.path(), "heap-cpython.html");
    eprintln!(
        "heap report of 1,504 stacks of 300 frames (the issue's CPython run): {}",
        megabytes(size)
    );
    assert!(size <= CPYTHON_REPORT_MAX, "{}", megabytes(size));
    let Some(chromium) = Chromium::find() else {
        return;
    };
    let (text, _) = chromium.printed_text(&page);
    let printed = printed_flamegraphs(&text);
    assert_eq!(printed.len(), 6, "{text}");
    for (title, body) in printed {
        assert!(body.contains("Py_BytesMain"), "{title}: {body}");
    }
}

/// What the checking page read and did in a browser: every view drawn, the search
/// highlighting boxes and filtering the tables, a click zooming in and choosing the
/// function, the value switched, the tables opened, and printing drawing every
/// value's flamegraph with the interpreter's frames.
fn check_reading(browser: &str, reading: &Reading, took: Duration, printed: usize) {
    eprintln!(
        "  {browser}: loaded, used and read in {:.2} s (its script drew every view in {} ms, \
         the printed flamegraphs in {} ms)",
        took.as_secs_f64(),
        reading["drawnMs"].as_str().unwrap_or("?"),
        reading["printMs"]
    );
    assert!(reading["error"].is_null(), "{browser}: {reading}");
    assert!(
        reading["drawnMs"].is_string(),
        "{browser}: the script did not finish: {reading}"
    );
    assert_eq!(reading["failed"], serde_json::json!([]), "{browser}");
    assert!(reading["flameBoxes"].as_u64().unwrap() > 500, "{reading}");
    let names = |value: &serde_json::Value| -> Vec<String> {
        value
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(names(&reading["flameText"])
        .iter()
        .any(|n| n == "Py_BytesMain"));
    let text = |value: &serde_json::Value| value.as_str().unwrap_or("").to_string();

    let search = &reading["search"];
    assert!(
        text(&search["matches"]).starts_with("1 function matches: "),
        "{browser}: {search}"
    );
    assert!(
        search["highlighted"].as_u64().unwrap() > 0,
        "{browser}: {search}"
    );
    let functions = names(&search["functions"]);
    assert!(
        !functions.is_empty() && functions.iter().all(|f| f.contains(SEARCH)),
        "{browser}: {functions:?}"
    );
    assert_eq!(reading["afterSearch"]["highlighted"], 0, "{browser}");
    assert_eq!(reading["afterSearch"]["matches"], "", "{browser}");

    let zoom = &reading["zoom"];
    assert!(
        text(&zoom["details"]).starts_with("zoomed on Py_BytesMain in python3.11"),
        "{browser}: {zoom}"
    );
    let neighbours = text(&zoom["neighbours"]);
    assert!(
        neighbours.contains("Callers and callees of Py_BytesMain")
            && neighbours.contains("Called by")
            && neighbours.contains("main in python3.11")
            && neighbours.contains("pymain_run_python"),
        "{browser}: {neighbours}"
    );
    let switched = &reading["switched"];
    let to = text(&switched["to"]);
    let to = to.split(" — ").next().unwrap_or("");
    assert!(
        !to.is_empty() && text(&switched["details"]).contains(to),
        "{browser}: {switched}"
    );

    let top_down = &reading["topDown"];
    assert!(
        top_down["after"].as_u64() > top_down["before"].as_u64(),
        "{browser}: {top_down}"
    );
    // Opened, malloc shows its caller (the toggles are the rows' first characters).
    let bottom_up: Vec<String> = names(&reading["bottomUp"]["rows"])
        .iter()
        .map(|row| row.trim_start_matches(['▾', '▸']).to_string())
        .collect();
    assert!(
        bottom_up.len() >= 2
            && bottom_up[0].starts_with("malloc in libc.so.6")
            && bottom_up[1].starts_with("_PyObject_Malloc"),
        "{browser}: {bottom_up:?}"
    );

    let figures = reading["printed"].as_array().unwrap();
    assert_eq!(figures.len(), printed, "{browser}: {reading}");
    for figure in figures {
        assert!(
            names(&figure["names"]).iter().any(|n| n == "Py_BytesMain"),
            "{browser}: {}",
            figure["title"]
        );
    }
}

/// The views of a heap report of 100 k stacks, used in Chromium and in Firefox.
#[test]
fn the_views_in_use_in_chromium_and_firefox() {
    let scratch = tempfile::tempdir().unwrap();
    let profile = interpreter(100_000, 500, Kind::Heap);
    let (page, _, _) = report(&profile, scratch.path(), "heap-100k.html");
    let mut checked = 0;
    for (browser, check) in [
        ("chromium", Chromium::find().map(|c| c.check(&page))),
        ("firefox", Firefox::find().map(|f| f.check(&page))),
    ] {
        let Some((reading, took)) = check else {
            continue;
        };
        check_reading(browser, &reading, took, 6);
        assert!(reading["charts"].as_u64().unwrap() >= 3, "{reading}");
        let views = &reading["views"];
        for (view, words) in [
            ("leaks-view", "leaked in"),
            ("sizes-view", "by size"),
            ("lifetimes-view", "by how long they lived"),
            ("memory-view", "The stacks that hold the most"),
            ("functions-view", "Py_BytesMain"),
            ("top-down-view", "Py_BytesMain"),
            ("bottom-up-view", "malloc"),
            ("processes-view", "pid 4243"),
            ("events-view", "stack walks in"),
        ] {
            let text = views[view].as_str().unwrap_or("");
            assert!(text.contains(words), "{browser}: {view}: {text}");
        }
        let leaks = reading["search"]["leaks"].as_str().unwrap_or("");
        assert!(
            leaks.contains("the stacks through “list_append”"),
            "{browser}: {leaks}"
        );
        checked += 1;
    }
    if checked == 0 {
        eprintln!("no browser: the views were not used");
    }
}

/// A profile with nothing in it: every view says so in words, none fails.
#[test]
fn views_with_nothing_in_them_say_so() {
    let Some(chromium) = Chromium::find() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    for kind in [Kind::Cpu, Kind::Heap] {
        let mut profile = interpreter(10, 40, kind);
        profile.samples.clear();
        profile.metadata.timeline.clear();
        if let Some(heap) = &mut profile.heap {
            heap.timeline.clear();
            heap.processes.clear();
        }
        let (page, _, _) = report(&profile, scratch.path(), &format!("empty-{kind:?}.html"));
        let (dom, _) = chromium.dom(&page);
        let dom = dom.split("<script").next().unwrap_or(&dom);
        assert!(!dom.contains("could not be drawn"), "{kind:?}: {dom}");
        let mut words = vec![
            "in this profile: nothing to draw.",
            "No counts over time were kept for this run",
            "No stacks: no process to list.",
            "in this profile: no functions to list.",
            "No function chosen",
            "in this profile: the tree is empty.",
            "in this profile: nothing to list.",
        ];
        if kind == Kind::Heap {
            words.extend([
                "No memory over time was kept for this run",
                "No stack held memory at the peak or at the end.",
                "No leaks: every block allocated while tracing was freed by the end.",
                "No allocation sizes were counted.",
                "No block was freed.",
            ]);
        }
        for words in words {
            assert!(dom.contains(words), "{kind:?}: {words:?} in {dom}");
        }
    }
}
