//! The outputs as the tools people use read them: pprof through `go tool pprof` and
//! through a decoder of its own (prost, from pprof's published schema), JSON and
//! speedscope through serde_json, against the folded stacks of the same run.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use cargo_trace_tests::fixtures;
use cargo_trace_tests::pprof::{self, text};
use common::go_pprof;
use common::{bpf_available, quoted, trace};

/// A frame of the folded output as pprof names it: without the kernel suffix.
fn pprof_name(folded_frame: &str) -> &str {
    folded_frame.strip_suffix("_[k]").unwrap_or(folded_frame)
}

#[test]
fn pprof_agrees_with_the_folded_stacks() {
    if !bpf_available("pprof output") {
        return;
    }
    let path = fixtures::rust_fixture("cpu_split");
    let run = trace(
        "pprof",
        &["profile:hz:99"],
        &format!("{} 1", quoted(&path)),
        &[
            "--pprof",
            "out.pb.gz",
            "--json",
            "out.json",
            "--speedscope",
            "out.speedscope.json",
        ],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let folded = run.folded();
    let file = run.scratch.path("out.pb.gz");
    let profile = pprof::read(&file);

    // Our own decoder: value types, totals, the executable's mapping first with the
    // build id of the file, every location's mapping known.
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (text(&profile, t.r#type), text(&profile, t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total as u64, folded.total());
    assert_eq!(
        total,
        profile.sample.iter().map(|s| s.value[1]).sum::<i64>() / 10_101_010
    );
    let executable = &profile.mapping[0];
    assert_eq!(
        std::path::Path::new(text(&profile, executable.filename)),
        path.canonicalize().unwrap()
    );
    let data = std::fs::read(&path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    assert_eq!(
        Some(text(&profile, executable.build_id).to_string()),
        process_image::build_id(&elf)
    );
    let libc = profile
        .mapping
        .iter()
        .find(|m| text(&profile, m.filename).ends_with("/libc.so.6"))
        .expect("libc's mapping");
    assert!(!text(&profile, libc.build_id).is_empty() && libc.file_offset > 0);

    // The JSON and speedscope outputs of the same run hold the same total.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.scratch.path("out.json")).unwrap()).unwrap();
    assert_eq!(json["summary"]["totals"][0], total);
    let json_total: i64 = json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["values"][0].as_i64().unwrap())
        .sum();
    assert_eq!(json_total, total);
    let speedscope: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.scratch.path("out.speedscope.json")).unwrap())
            .unwrap();
    // speedscope's one view of the clock: its samples as the CPU time they stand for.
    let profiles = speedscope["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1, "{profiles:?}");
    assert_eq!(profiles[0]["unit"], "nanoseconds");
    assert_eq!(profiles[0]["endValue"], total * 10_101_010);

    if !go_pprof::available() {
        return;
    }
    // go tool pprof: the same total, the same hottest function, the inlined frame.
    let top = go_pprof::run(&["-top", "-nodecount=1"], &file);
    assert!(
        top.contains(&format!("Total samples = {total}")),
        "pprof's total is not {total}:\n{top}"
    );
    let mut leaves: BTreeMap<&str, u64> = BTreeMap::new();
    for (frames, count) in &folded.stacks {
        *leaves
            .entry(pprof_name(frames.last().unwrap()))
            .or_default() += count;
    }
    let (hottest, flat) = leaves.iter().max_by_key(|(_, count)| **count).unwrap();
    let first_row = go_pprof::top_rows(&top)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no rows in:\n{top}"));
    assert_eq!(first_row.flat, flat.to_string(), "{first_row:?}");
    assert_eq!(
        *hottest,
        "cpu_split::xorshift_rounds",
        "{folded:?}",
        folded = leaves
    );
    assert!(
        first_row.function.contains("cpu_split::xorshift_rounds"),
        "pprof's hottest function: {first_row:?}"
    );
    // The inlined function is shown inside the function it was inlined into.
    let traces = go_pprof::run(&["-traces"], &file);
    let inlined = traces
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .windows(2)
        .any(|pair| {
            pair[0].ends_with("cpu_split::xorshift_rounds (inline)")
                && pair[1].ends_with("cpu_split::hot")
        });
    assert!(inlined, "no xorshift_rounds inlined in hot:\n{traces}");
}

/// The `<title>` of `function`'s box in a differential flamegraph: `NAME (N samples,
/// P%; ±D%)`.
fn diff_title<'a>(svg: &'a str, function: &str) -> &'a str {
    let start = svg
        .find(&format!("<title>{function} ("))
        .unwrap_or_else(|| panic!("no box for {function}"));
    let end = start + svg[start..].find("</title>").unwrap();
    &svg[start..end]
}

#[test]
fn a_diff_marks_the_function_that_changed() {
    if !bpf_available("diff") {
        return;
    }
    let path = fixtures::rust_fixture("cpu_split");
    // hot:cold slices 2:1, then 1:2: hot shrinks, cold grows.
    let before = trace(
        "diff-before",
        &["profile:hz:99"],
        &format!("{} 1 2:1", quoted(&path)),
        &[],
    );
    let after = trace(
        "diff-after",
        &["profile:hz:99"],
        &format!("{} 1 1:2", quoted(&path)),
        &["--pprof", "after.pb.gz"],
    );
    assert!(before.status.success() && after.status.success());
    let scratch = tempfile::tempdir().unwrap();
    let svg = scratch.path().join("diff.svg");
    let folded = scratch.path().join("diff.folded");
    // Folded stacks before, pprof after: either format is read.
    let output = Command::new(common::binary())
        .arg("diff")
        .arg(&before.folded_path)
        .arg(after.scratch.path("after.pb.gz"))
        .arg("-o")
        .arg(&svg)
        .arg("--folded")
        .arg(&folded)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo-trace diff failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Differential folded lines: `stack BEFORE AFTER`, BEFORE scaled to AFTER's total.
    let text = std::fs::read_to_string(&folded).unwrap();
    let (mut hot, mut cold) = ((0i64, 0i64), (0i64, 0i64));
    for line in text.lines() {
        let mut fields = line.rsplitn(3, ' ');
        let after: i64 = fields.next().unwrap().parse().unwrap();
        let before: i64 = fields.next().unwrap().parse().unwrap();
        let stack = fields.next().unwrap();
        let sum = if stack.contains("cpu_split::hot") {
            &mut hot
        } else if stack.contains("cpu_split::cold") {
            &mut cold
        } else {
            continue;
        };
        sum.0 += before;
        sum.1 += after;
    }
    // 2/3 of the time before and 1/3 after, and the other way round: far apart.
    assert!(
        hot.0 > hot.1 + 10 && cold.1 > cold.0 + 10,
        "hot {hot:?} cold {cold:?}"
    );
    // In the graph, a box's change is its own (self) samples': hot's are in its inlined
    // xorshift_rounds, which shrank; cold's leaves (core's inlined arithmetic) grew.
    let svg = std::fs::read_to_string(&svg).unwrap();
    let hot_work = diff_title(&svg, "cpu_split::xorshift_rounds");
    assert!(hot_work.contains("%; -"), "{hot_work}");
    assert!(svg.contains("%; +"), "nothing grew in the graph");
}

#[test]
fn a_diff_of_something_that_is_not_a_profile_is_one_line() {
    let scratch = tempfile::tempdir().unwrap();
    let bad = scratch.path().join("bad.txt");
    std::fs::write(&bad, "hello\n").unwrap();
    let output = Command::new(common::binary())
        .arg("diff")
        .arg(&bad)
        .arg(&bad)
        .arg("-o")
        .arg(scratch.path().join("d.svg"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("neither folded stacks nor pprof"),
        "{stderr}"
    );
}

/// The headless browser the report test opens it in; .ci/setup.sh installs Debian's
/// chromium, so under CI its absence is a failure.
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| Command::new(name).arg("--version").output().is_ok());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is missing: .ci/setup.sh installs it"
        );
        eprintln!("skipping the browser checks: no chromium (bash .ci/setup.sh installs it)");
    }
    found
}

/// Runs headless `browser` on `page` with `args`: (stdout, stderr).
fn headless(browser: &str, page: &std::path::Path, args: &[&str]) -> (String, String) {
    let output = Command::new(browser)
        .args([
            "--headless",
            // As root, chromium refuses to start inside its sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            // Any host name fails at once: a page that reached for the network would
            // log the failure.
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_html_report_opens_in_a_browser() {
    if !bpf_available("html report") {
        return;
    }
    let path = fixtures::rust_fixture("cpu_split");
    let run = trace(
        "report",
        &["profile:hz:99"],
        &format!("{} 1", quoted(&path)),
        &["--report", "report.html"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let report = run.scratch.path("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    // Self-contained: no URL outside the embedded (base64) flamegraphs.
    assert!(!html.contains("http:") && !html.contains("https:"));
    assert!(html.contains("cpu_split::hot") && html.contains("<svg id=\"timeline\""));

    let Some(browser) = chromium() else {
        return;
    };
    // The page as the browser built it: the fixture's functions, the timeline's bars,
    // both flamegraphs.
    let (dom, log) = headless(browser, &report, &["--dump-dom"]);
    assert!(dom.contains("cpu_split::xorshift_rounds"), "{dom}");
    assert!(dom.contains("<rect "), "no timeline bars");
    assert_eq!(dom.matches("class=\"flamegraph\"").count(), 2);
    let console: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("CONSOLE"))
        .collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(!log.contains("net::ERR"), "a network request: {log}");
    // A screenshot, kept for people to look at.
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("report.png");
    let _ = std::fs::remove_file(&screenshot);
    let (_, log) = headless(
        browser,
        &report,
        &[
            "--window-size=1280,2400",
            &format!("--screenshot={}", screenshot.display()),
        ],
    );
    let png = std::fs::read(&screenshot).unwrap_or_else(|e| panic!("no screenshot ({e}): {log}"));
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{log}");
    eprintln!("report screenshot: {}", screenshot.display());
}

/// Runs cargo-trace on `cpu_split` with `extra` arguments inside `script(1)`, so that its
/// stderr is a terminal; returns everything the terminal received.
fn on_a_terminal(extra: &str) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let command = format!(
        "{} profile:hz:99 -c '{} 1' -o {} {extra}",
        common::binary(),
        fixtures::rust_fixture("cpu_split").display(),
        scratch.path().join("out.svg").display()
    );
    let output = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run script(1)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    text
}

#[test]
fn a_progress_line_on_a_terminal_only() {
    if !bpf_available("progress line") {
        return;
    }
    // On a terminal: elapsed time and events as they come, cleared before the summary.
    let terminal = on_a_terminal("");
    assert!(terminal.contains("cargo-trace: tracing "), "{terminal}");
    assert!(terminal.contains(" events"), "{terminal}");
    assert!(terminal.contains(" distinct stacks in "), "{terminal}");
    // Not with -q.
    let quiet = on_a_terminal("-q");
    assert!(!quiet.contains("cargo-trace: tracing "), "{quiet}");
    // Not when stderr is a file or a pipe (every other test's case).
    let run = trace(
        "progress-pipe",
        &["profile:hz:99"],
        &format!("{} 0.3", quoted(&fixtures::rust_fixture("cpu_split"))),
        &[],
    );
    assert!(
        !run.stderr.contains("cargo-trace: tracing "),
        "{}",
        run.stderr
    );
}

/// `--open` hands the report to the desktop's opener (a stand-in `xdg-open` here, first
/// on PATH), and says in one line what to do where there is no desktop.
#[test]
fn open_shows_the_report_or_says_why_not() {
    if !bpf_available("--open") {
        return;
    }
    let bin = tempfile::tempdir().unwrap();
    let opened = bin.path().join("opened");
    let opener = bin.path().join("xdg-open");
    std::fs::write(
        &opener,
        format!("#!/bin/sh\necho \"$1\" > {}\n", opened.display()),
    )
    .unwrap();
    std::fs::set_permissions(&opener, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report.html");
    let cpu_split = fixtures::rust_fixture("cpu_split");
    let run = |display: Option<&str>| {
        let mut command = Command::new(common::binary());
        command
            .args(["profile:hz:99", "-c"])
            .arg(format!("{} 0.2", quoted(&cpu_split)))
            .arg("-o")
            .arg(scratch.path().join("out.svg"))
            .arg("--report")
            .arg(&report)
            .arg("--open")
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.path().display(),
                    std::env::var("PATH").unwrap()
                ),
            )
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID");
        match display {
            Some(display) => command.env("DISPLAY", display),
            None => command.env_remove("DISPLAY"),
        };
        command.output().unwrap()
    };
    let output = run(Some(":0"));
    assert!(output.status.success());
    // The opener runs in the background: wait for what it wrote.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // (a line, once the shell has written all of it).
    let written = loop {
        let text = std::fs::read_to_string(&opened).unwrap_or_default();
        if text.ends_with('\n') {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "xdg-open never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(written.trim(), report.display().to_string());
    std::fs::remove_file(&opened).unwrap();

    let output = run(None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("--open: no desktop here") && stderr.contains("report.html yourself"),
        "{stderr}"
    );
    assert!(!opened.exists());
}
