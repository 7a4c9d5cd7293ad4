//! `cargo trace alloc` end to end: the heap fixtures' sites counted exactly (allocations,
//! bytes, frees, leaks, size buckets, temporaries) with their whole stacks, read from the
//! CSV output, the text report and the folded stacks of the chosen metric.

mod common;
mod heap_sites;

use cargo_trace_tests::expected::{self, HeapSite};
use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace, Run};
use heap_sites::{check_sites, read_csv, rows_of, sum, Row};

/// A child ended with `signal` (twice: a session kills a target that ignores the first)
/// and reaped should the test end first, by a panic: a session left running keeps its
/// probes in every process, and changes what other sessions see.
struct EndOnDrop(Option<std::process::Child>, i32);

impl EndOnDrop {
    fn take(&mut self) -> std::process::Child {
        self.0.take().expect("the child")
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            for _ in 0..2 {
                // SAFETY: kill(2) on our own unreaped child.
                unsafe { libc::kill(child.id() as i32, self.1) };
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            let _ = child.wait();
        }
    }
}

/// The extra arguments of a run that must be recorded in the process when its probe is
/// plain `alloc` (`--bpf-stats` names the path that recorded).
fn stats_for(probe: &str) -> &'static [&'static str] {
    if probe == "alloc" {
        &["--csv", "heap.csv", "--bpf-stats"]
    } else {
        &["--csv", "heap.csv"]
    }
}

/// Asserts that `alloc` recorded `run` in the process, every allocator function hooked:
/// `--bpf-stats` has the in-process lines, no BPF heap program's. An allocator named
/// (`alloc:jemalloc`) too: the summary says the library recorded it.
fn assert_in_process(probe: &str, run: &Run) {
    if probe == "alloc" {
        assert!(
            run.stderr.contains("in-process: hooks: ")
                && !run.stderr.contains("bpf on_alloc")
                && !run.stderr.contains("could not be hooked"),
            "not recorded in the process, every function hooked:\n{}",
            run.stderr
        );
    } else {
        assert!(
            run.stderr
                .contains("note: recorded in the process by the preloaded library")
                && !run.stderr.contains("is probed with BPF")
                && !run.stderr.contains("could not be hooked"),
            "{probe}: not recorded in the process, every function hooked:\n{}",
            run.stderr
        );
    }
}

fn alloc_run(name: &str, fixture: &std::path::Path, extra: &[&str]) -> Run {
    alloc_command_run(name, &quoted(fixture), extra)
}

/// `alloc` on a command line, with the CSV and the text report.
fn alloc_command_run(name: &str, command: &str, extra: &[&str]) -> Run {
    // `--mmap`: the fixtures' anonymous mappings are sites of their own, counted as blocks.
    let mut args = vec!["--csv", "heap.csv", "--report-text", "report.txt", "--mmap"];
    args.extend(extra);
    trace(name, &["alloc"], command, &args)
}

/// Launched, the target runs with the preloaded library, which records every call in the
/// process (no BPF program runs); `--no-preload` probes libc's functions themselves. Both
/// count every function exactly.
#[test]
fn every_libc_function_is_counted_exactly() {
    if !bpf_available("every_libc_function_is_counted_exactly") {
        return;
    }
    let run = check_every_libc_function("alloc-c", &["--bpf-stats"]);
    assert!(
        run.stderr.contains("cargo-trace: in-process: ") && !run.stderr.contains("bpf on_"),
        "{}",
        run.stderr
    );
}

#[test]
fn every_libc_function_is_counted_exactly_without_the_preload() {
    if !bpf_available("every_libc_function_is_counted_exactly_without_the_preload") {
        return;
    }
    let run = check_every_libc_function("alloc-c-no-preload", &["--no-preload", "--bpf-stats"]);
    assert!(
        run.stderr.contains("bpf on_alloc: ") && !run.stderr.contains("on_preload"),
        "{}",
        run.stderr
    );
}

/// By default anonymous mappings are kept apart from the heap, on both paths: the
/// fixture's `site_mmap` has no heap rows, its four mappings are the JSON's mapped
/// memory (made, unmapped, none live), and the summary and the text report say so;
/// every other site is still exact.
#[test]
fn anonymous_mappings_are_apart_by_default() {
    if !bpf_available("anonymous_mappings_are_apart_by_default") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    for (name, extra) in [
        ("alloc-mmap-apart", &[][..]),
        ("alloc-mmap-apart-no-preload", &["--no-preload"][..]),
    ] {
        let mut args = vec!["--csv", "heap.csv", "--report-text", "report.txt"];
        args.extend(["--json", "heap.json"]);
        args.extend(extra);
        let run = trace(name, &["alloc"], &quoted(&path), &args);
        assert!(run.status.success(), "{name}: {}", run.stderr);
        run.assert_every_walk_complete();
        let rows = read_csv(&run, "heap.csv");
        let sites = expected::parse_heap_sites(&run.stdout).unwrap();
        for site in &sites {
            let rows = rows_of(&rows, site);
            let allocs = if site.function == "site_mmap" {
                0
            } else {
                site.allocs
            };
            assert_eq!(
                sum(&rows, "allocs") as u64,
                allocs,
                "{name}: {}",
                site.function
            );
        }
        let mmap = sites.iter().find(|s| s.function == "site_mmap").unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.scratch.path("heap.json")).unwrap()).unwrap();
        let mapped = &json["heap"]["mapped"];
        assert_eq!(mapped["counted"], false, "{name}: {mapped}");
        assert_eq!(
            mapped["mappings"].as_u64(),
            Some(mmap.allocs),
            "{name}: {mapped}"
        );
        assert_eq!(
            mapped["bytes"].as_u64(),
            Some(mmap.bytes),
            "{name}: {mapped}"
        );
        assert_eq!(
            mapped["unmappings"].as_u64(),
            Some(mmap.frees),
            "{name}: {mapped}"
        );
        assert_eq!(mapped["live_bytes"].as_i64(), Some(0), "{name}: {mapped}");
        // The library's memory, where it recorded: one process, within its bounds.
        let memory = &json["heap"]["in_process"];
        if extra.is_empty() {
            assert_eq!(memory["processes"], 1, "{name}: {memory}");
            let used = memory["region_used_bytes"].as_u64().unwrap();
            assert!(used > 0 && used <= memory["region_bytes"].as_u64().unwrap());
            let own = memory["own_bytes"].as_u64().unwrap();
            assert!(own > 0 && own <= memory["own_bound_bytes"].as_u64().unwrap());
            assert!(
                run.stderr.contains("cargo-trace: note: recorded in the process by the preloaded library: its memory in 1 process, at most "),
                "{name}: {}",
                run.stderr
            );
        } else {
            assert!(memory.is_null(), "{name}: {memory}");
        }
        assert!(
            run.stderr
                .contains("cargo-trace: note: mapped memory (anonymous mmap) "),
            "{name}: {}",
            run.stderr
        );
        let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
        assert!(
            report.contains("mapped memory (anonymous mmap, "),
            "{name}: {report}"
        );
    }
}

fn check_every_libc_function(name: &str, extra: &[&str]) -> Run {
    let path = fixtures::c_fixture("alloc_c");
    let run = alloc_run(name, &path, extra);
    let rows = read_csv(&run, "heap.csv");
    let sites = check_sites(&run, &rows);
    assert_eq!(sites.len(), 14, "{}", run.stdout);
    // Live at the peak: site_peak's three blocks, and nothing of any other stack.
    let peak_site = sites.iter().find(|s| s.function == "site_peak").unwrap();
    assert_eq!(sum(&rows_of(&rows, peak_site), "peak_bytes"), 3 * 20011);
    assert_eq!(
        rows.iter().map(|r| r.value("peak_bytes")).sum::<i64>(),
        3 * 20011
    );
    // Outstanding at exit: the leaking site's blocks and nothing else (the fixture writes
    // with write(2), so stdio allocates no buffer).
    let leaked = sites.iter().find(|s| s.leaked > 0).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.value("leaked_bytes")).sum::<i64>() as u64,
        leaked.leaked * leaked.size
    );
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(report.contains("unknown frees 0"), "{report}");
    assert!(report.contains("peak 60033 B"), "{report}");
    let leaks = report
        .split("top 10 leaks")
        .nth(1)
        .expect("a leaks section");
    assert!(
        leaks.contains("#1 7 blocks, 7651 B") && leaks.contains("site_leak <- main"),
        "{report}"
    );
    run
}

#[test]
fn rust_sites_are_exact_with_their_whole_stacks() {
    if !bpf_available("rust_sites_are_exact_with_their_whole_stacks") {
        return;
    }
    let path = fixtures::rust_fixture("alloc_sites");
    // Temporaries are blocks freed within 10 ms here: the fast site frees at once, with
    // room for a preemption; the slow one holds its blocks 30 ms.
    let run = alloc_run(
        "alloc-rust",
        &path,
        &[
            "--temporary-ms",
            "10",
            "--heaptrack",
            "heap.gz",
            "--json",
            "heap.json",
        ],
    );
    let rows = read_csv(&run, "heap.csv");
    let sites = check_sites(&run, &rows);
    // Threads, 70-frame stacks, std's own blocks: heaptrack states the same totals.
    check_json_and_heaptrack(&run, "heap.gz");
    let site = |name: &str| {
        sites
            .iter()
            .find(|s| s.function == format!("alloc_sites::{name}"))
            .unwrap_or_else(|| panic!("no site {name}"))
    };

    // The leaks, under the leaking site's whole chain from _start.
    let leaky = rows_of(&rows, site("leaky_site"));
    for row in leaky.iter().filter(|row| row.value("leaked_blocks") > 0) {
        assert_eq!(row.frames.first().map(String::as_str), Some("_start"));
        assert!(row.frames.contains(&"alloc_sites::main".to_string()));
    }
    // 70 frames of recursion and more.
    for row in rows_of(&rows, site("deep_site")) {
        let dives = row
            .frames
            .iter()
            .filter(|f| *f == "alloc_sites::dive")
            .count();
        assert_eq!(dives, 70, "{:?}", row.frames);
        assert_eq!(row.frames[0], "_start");
    }
    // The second thread's stacks start at its thread's start.
    for row in rows_of(&rows, site("thread_site")) {
        assert!(
            row.frames.iter().any(|f| f == "start_thread"),
            "{:?}",
            row.frames
        );
    }
    // Temporaries: every block of the fast site, none of the slow one's.
    assert_eq!(sum(&rows_of(&rows, site("fast_site")), "temporaries"), 50);
    assert_eq!(sum(&rows_of(&rows, site("slow_site")), "temporaries"), 0);
    // Lifetimes: the slow site's blocks lived 30 ms or more (bit length >= 25 in ns).
    let slow = rows_of(&rows, site("slow_site"));
    let long_lived: i64 = (25..48)
        .map(|k| sum(&slow, &format!("lifetime_bucket_{k}")))
        .sum();
    assert_eq!(long_lived, 10);
}

#[test]
fn the_metric_weighs_the_flamegraph() {
    if !bpf_available("the_metric_weighs_the_flamegraph") {
        return;
    }
    let path = fixtures::rust_fixture("alloc_sites");
    let run = alloc_run("alloc-metric", &path, &["--metric", "leaked-bytes"]);
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let folded = run.folded();
    assert_eq!(folded.count_with("alloc_sites::leaky_site"), 37 * 3001);
    assert_eq!(folded.count_with("alloc_sites::fast_site"), 0);
    let svg = std::fs::read_to_string(&run.svg).unwrap();
    assert!(svg.contains("(bytes leaked)"), "the title names the metric");
    assert!(
        svg.contains("leaked_bytes"),
        "the count name is the metric's"
    );
}

/// A counting probe beside `alloc` keeps its own counts, and the heap's stay exact.
#[test]
fn alloc_beside_another_probe() {
    if !bpf_available("alloc_beside_another_probe") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    let run = trace(
        "alloc-beside",
        &["alloc", "uprobe:libc:posix_memalign"],
        &quoted(&path),
        &["--csv", "heap.csv", "--mmap"],
    );
    let rows = read_csv(&run, "heap.csv");
    check_sites(&run, &rows);
    let uprobe: Vec<&Row> = rows
        .iter()
        .filter(|row| row.probe == "uprobe:libc:posix_memalign")
        .collect();
    assert_eq!(sum(&uprobe, "events"), 4);
    assert_eq!(sum(&uprobe, "allocs"), 0);
    let heap: Vec<&Row> = rows.iter().filter(|row| row.probe == "alloc").collect();
    assert_eq!(sum(&heap, "events"), 0);
}

/// More live blocks than a deliberately small live map holds: the blocks left out are
/// counted and said so, and every other figure stays right.
#[test]
fn a_full_live_map_is_counted_and_reported() {
    if !bpf_available("a_full_live_map_is_counted_and_reported") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    // alloc_c holds at most one block at a time until its 7 leaks.
    let run = alloc_run(
        "alloc-full",
        &path,
        &[
            "--max-live-blocks",
            "3",
            "--json",
            "heap.json",
            "--heaptrack",
            "heap.zst",
        ],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let rows = read_csv(&run, "heap.csv");
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    for site in &sites {
        let rows = rows_of(&rows, site);
        assert_eq!(
            sum(&rows, "allocs") as u64,
            site.allocs,
            "{}",
            site.function
        );
        assert_eq!(sum(&rows, "frees") as u64, site.frees, "{}", site.function);
    }
    let leak = sites.iter().find(|s| s.leaked > 0).unwrap();
    let leak_rows = rows_of(&rows, leak);
    assert_eq!(sum(&leak_rows, "leaked_blocks"), 3);
    assert_eq!(sum(&leak_rows, "untracked"), 4);
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(
        report.contains("blocks untracked (live map full): 4 (--max-live-blocks)"),
        "{report}"
    );
    // The JSON counts them; heaptrack states the report's calls, peak and leaks (3
    // blocks), the untracked blocks freed where they move neither.
    let (totals, _) = check_json_and_heaptrack(&run, "heap.zst");
    assert_eq!(totals[6], 3 * leak.size as i64);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.scratch.path("heap.json")).unwrap()).unwrap();
    assert_eq!(json["heap"]["lost"]["blocks untracked (live map full)"], 4);
    assert_eq!(
        json["heap"]["raised_by"]["blocks untracked (live map full)"][0],
        "--max-live-blocks"
    );
}

/// A statistics map with room for two stacks under a fixture with fourteen allocation
/// sites: the report counts the events of the others as uncounted, with the options that
/// raise the map, and keeps two stacks at most.
#[test]
fn a_full_stats_map_names_its_options() {
    if !bpf_available("a_full_stats_map_names_its_options") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    // The kernel's map of statistics: the BPF heap path's (in the process, the statistics
    // are cargo-trace's own).
    let run = alloc_run(
        "alloc-stats-full",
        &path,
        &["--max-heap-stacks", "2", "--no-preload"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    let (_, uncounted) = report
        .split_once("note: events uncounted (stats map full): ")
        .unwrap_or_else(|| panic!("no stats map limit: {report}"));
    let (count, options) = uncounted.split_once(' ').unwrap();
    assert!(count.parse::<u64>().unwrap() > 0, "{report}");
    assert!(
        options.starts_with("(--max-heap-stacks or --max-processes)\n"),
        "{report}"
    );
    let rows = read_csv(&run, "heap.csv");
    let stacks = rows.iter().filter(|row| row.value("allocs") > 0).count();
    assert!(stacks <= 2, "{stacks} stacks kept: {report}");
}

/// `alloc:PATH` probes the allocator of that file: libc by its path counts as `alloc` does.
#[test]
fn an_allocator_named_by_its_path() {
    if !bpf_available("an_allocator_named_by_its_path") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    let libc = process_image::mapped_files(std::process::id())
        .unwrap()
        .into_iter()
        .find(|p| p.ends_with("libc.so.6"))
        .expect("this test process maps libc.so.6");
    let probe = format!("alloc:{}", libc.display());
    let run = trace(
        "alloc-path",
        &[&probe],
        &quoted(&path),
        &["--csv", "heap.csv", "--mmap"],
    );
    assert_in_process(&probe, &run);
    let rows = read_csv(&run, "heap.csv");
    check_sites(&run, &rows);
}

/// Attached to a running process that leaks 100 blocks a second at one site and frees
/// everything else: that site is the top outstanding stack, with a count the rate allows,
/// the live view names it while tracing, and the frees of blocks allocated before the
/// attach are counted apart, not subtracted from anything.
#[test]
fn attached_to_a_leaking_server() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    if !bpf_available("attached_to_a_leaking_server") {
        return;
    }
    let path = fixtures::c_fixture("leak_rate");
    let mut server = EndOnDrop(
        Some(
            Command::new(&path)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start leak_rate"),
        ),
        libc::SIGKILL,
    );
    let server_pid = server.0.as_ref().unwrap().id();
    let mut ready = String::new();
    std::io::BufReader::new(server.0.as_mut().unwrap().stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");

    let scratch = common::Scratch::new("alloc-attach");
    // Long enough for views past the first second, when the leaking site has outgrown
    // the churn site's 50 live blocks, even if a loaded machine delays some views.
    let seconds = 3.0;
    let started = std::time::Instant::now();
    let output = Command::new(common::binary())
        .args([
            "alloc",
            "-p",
            &server_pid.to_string(),
            "-d",
            &seconds.to_string(),
        ])
        .args(["--interval", "500ms", "--no-svg", "--csv", "heap.csv"])
        .args(["--report-text", "report.txt", "--timeline", "timeline.csv"])
        .args(["--report", "report.html"])
        .current_dir(&scratch.0)
        .output()
        .expect("run cargo-trace");
    // The probes are attached for less than the whole command: from before tracing starts
    // to after it stops, they count what the target did in at most this long.
    let attached = started.elapsed().as_secs_f64();
    drop(server);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(output.status.success(), "cargo-trace failed: {stderr}");

    // The last live view's top stack (in the first, half a second in, the leaking site
    // may not have outgrown the churn site's 50 live blocks yet).
    let lines: Vec<&str> = stderr.lines().collect();
    let last_view = lines
        .iter()
        .rposition(|line| line.contains("cargo-trace: live at"))
        .unwrap_or_else(|| panic!("no live view in {stderr}"));
    let live = lines
        .get(last_view + 1)
        .unwrap_or_else(|| panic!("an empty live view in {stderr}"));
    assert!(live.contains("site_leak_tick"), "{live}");

    let run = Run {
        status: output.status,
        stdout: String::new(),
        stderr: stderr.to_string(),
        svg: scratch.path("none.svg"),
        folded_path: scratch.path("none.folded"),
        scratch,
    };
    let rows = read_csv(&run, "heap.csv");
    let top = rows
        .iter()
        .max_by_key(|row| row.value("leaked_blocks"))
        .unwrap();
    assert!(
        top.frames.iter().any(|f| f == "site_leak_tick"),
        "{:?}",
        top.frames
    );
    // 100 a second at most, while attached; a loaded machine sleeps longer between ticks.
    let leaked = top.value("leaked_blocks") as f64;
    assert!(
        (0.1 * 100.0 * seconds..=100.0 * attached + 1.0).contains(&leaked),
        "{leaked} blocks leaked in {seconds} s of tracing ({attached:.2} s attached)"
    );
    // The churn site's blocks: each freed one was allocated while attached.
    let churn: Vec<&Row> = rows
        .iter()
        .filter(|row| row.frames.iter().any(|f| f == "site_churn"))
        .collect();
    assert!(sum(&churn, "frees") <= sum(&churn, "allocs"));
    assert!(sum(&churn, "leaked_blocks") <= 50);
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    let unknown: u64 = report
        .split("unknown frees ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no unknown frees in {report}"));
    assert!(unknown >= 1, "{report}");

    // The timeline: a point every 100 ms, live bytes growing with the leak, the process's
    // resident memory while it ran.
    let timeline = std::fs::read_to_string(run.scratch.path("timeline.csv")).unwrap();
    let points: Vec<Vec<i64>> = timeline
        .lines()
        .skip(1)
        .map(|line| line.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert!(points.len() >= 5, "{timeline}");
    let live: Vec<i64> = points.iter().map(|p| p[1]).collect();
    assert!(
        live.last() > live.first() && live.windows(2).filter(|w| w[1] < w[0]).count() <= 2,
        "live bytes grow with the leak:\n{timeline}"
    );
    assert!(points.iter().any(|p| p[4] > 0), "{timeline}");
    // The HTML report draws the same points.
    let html = std::fs::read_to_string(run.scratch.path("report.html")).unwrap();
    let chart = html
        .split("id=\"heap-timeline\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no memory chart in the HTML report"));
    let polyline = chart.split("points=\"").nth(1).unwrap();
    let drawn = polyline[..polyline.find('"').unwrap()].split(' ').count();
    assert_eq!(drawn, points.len());
}

/// The storm site's estimate under sampling, against the fixture's own count: within five
/// standard deviations of the binomial number of sampled calls (a failure by chance once
/// in about 1.7 million runs).
fn check_estimate(storm: &str, option: &[&str], column: &str, exact: f64, sigma: f64) {
    let path = fixtures::c_fixture("heap_storm");
    let run = trace(
        "alloc-sampled",
        &["alloc"],
        &format!("{} {storm}", quoted(&path)),
        &[
            &[
                "--csv",
                "heap.csv",
                "--report-text",
                "report.txt",
                "--json",
                "heap.json",
            ],
            option,
        ]
        .concat(),
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let rows = read_csv(&run, "heap.csv");
    let site = expected::parse_heap_sites(&run.stdout).unwrap().remove(0);
    let estimate = sum(&rows_of(&rows, &site), column) as f64;
    assert!(
        (estimate - exact).abs() <= 5.0 * sigma,
        "{option:?}: {column} estimated {estimate}, exactly {exact} (sigma {sigma:.0})"
    );
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(
        report.contains("sampled: "),
        "the report says it is sampled:\n{report}"
    );
    // The JSON says how, with the report's totals.
    let (_, heap) = check_json(&run);
    let (mode, value) = match option {
        ["--sample-every", n] => ("every", n.parse::<u64>().unwrap()),
        ["--sample-bytes", "4K"] => ("bytes", 4096),
        _ => panic!("{option:?}"),
    };
    assert_eq!(heap["sampling"]["mode"], mode, "{heap}");
    assert_eq!(heap["sampling"]["value"], value, "{heap}");
}

#[test]
fn sampling_one_call_in_n_estimates_the_counts() {
    if !bpf_available("sampling_one_call_in_n_estimates_the_counts") {
        return;
    }
    // 200000 calls, each counted with a chance of 1/100, worth 100.
    let (n, p) = (200_000.0, 0.01);
    let sigma = (n * p * (1.0f64 - p)).sqrt() / p;
    check_estimate("200000 10", &["--sample-every", "100"], "allocs", n, sigma);
}

/// A realloc is sampled 1 in N as the other calls are (it goes on past the first choice,
/// to free its old block): 100000 malloc + realloc pairs, 200000 allocations, each
/// counted with a chance of 1/100.
#[test]
fn sampling_one_call_in_n_counts_reallocs_once() {
    if !bpf_available("sampling_one_call_in_n_counts_reallocs_once") {
        return;
    }
    let (n, p) = (200_000.0, 0.01);
    let sigma = (n * p * (1.0f64 - p)).sqrt() / p;
    check_estimate(
        "100000 10 realloc",
        &["--sample-every", "100"],
        "allocs",
        n,
        sigma,
    );
}

#[test]
fn sampling_by_bytes_estimates_the_bytes() {
    if !bpf_available("sampling_by_bytes_estimates_the_bytes") {
        return;
    }
    // 200000 blocks of 48 bytes, each counted with a chance of 48/4096, worth 4096 bytes.
    let (n, p) = (200_000.0, 48.0 / 4096.0);
    let sigma = (n * p * (1.0f64 - p)).sqrt() * 4096.0;
    check_estimate(
        "200000 10",
        &["--sample-bytes", "4K"],
        "alloc_space",
        n * 48.0,
        sigma,
    );
}

/// Children that fork and exec are profiled as processes of their own: each run of the
/// fixture under a shell has its sites exact under its own pid.
#[test]
fn children_are_their_own_processes() {
    if !bpf_available("children_are_their_own_processes") {
        return;
    }
    let (_, rows, sites, pids) = alloc_c_twice("alloc-children", "");
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        let own: Vec<Row> = rows.iter().filter(|row| row.pid == pid).cloned().collect();
        for site in &sites[..14] {
            let rows = rows_of(&own, site);
            assert_eq!(
                sum(&rows, "allocs") as u64,
                site.allocs,
                "{} in {pid}",
                site.function
            );
            assert_eq!(
                sum(&rows, "alloc_space") as u64,
                site.bytes,
                "{} bytes in {pid}",
                site.function
            );
            assert_eq!(
                sum(&rows, "frees") as u64,
                site.frees,
                "{} in {pid}",
                site.function
            );
            assert_eq!(
                sum(&rows, "leaked_blocks") as u64,
                site.leaked,
                "{} in {pid}",
                site.function
            );
        }
    }
}

/// `alloc` on a shell that runs the `alloc_c` fixture, then `second_prefix` and the
/// fixture again with the argument `second`: the run, its CSV rows, the 28 sites both
/// runs printed, and the pids whose rows hold `site_malloc`.
fn alloc_c_twice(
    name: &str,
    second_prefix: &str,
) -> (
    Run,
    Vec<Row>,
    Vec<HeapSite>,
    std::collections::BTreeSet<u32>,
) {
    let path = quoted(&fixtures::c_fixture("alloc_c"));
    let script = format!("{path} && {second_prefix}{path} second");
    let run = trace(
        name,
        &["alloc"],
        &format!("/bin/sh -c {}", common::shell_quote(&script)),
        &["--csv", "heap.csv", "--mmap"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let rows = read_csv(&run, "heap.csv");
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    assert_eq!(sites.len(), 28, "two runs of 14 sites: {}", run.stdout);
    let pids = rows
        .iter()
        .filter(|row| row.frames.iter().any(|f| f == "site_malloc"))
        .map(|row| row.pid)
        .collect();
    (run, rows, sites, pids)
}

/// A child whose environment drops `LD_PRELOAD` runs without the preloaded library: its
/// heap is not counted, and one line says so, naming it; its sibling with the library is
/// counted exactly.
#[test]
fn a_child_without_the_preload_is_reported() {
    if !bpf_available("a_child_without_the_preload_is_reported") {
        return;
    }
    let (run, rows, sites, pids) = alloc_c_twice("alloc-no-preload-child", "env -u LD_PRELOAD ");
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.contains("without cargo-trace's preloaded library"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(
        warnings[0].starts_with("cargo-trace: warning: 1 process (pid ")
            && warnings[0].contains("alloc_c second)")
            && warnings[0].contains("--no-preload"),
        "{}",
        warnings[0]
    );
    assert_eq!(pids.len(), 1, "only the first child is counted: {pids:?}");
    for site in &sites[..14] {
        let rows = rows_of(&rows, site);
        assert_eq!(
            sum(&rows, "allocs") as u64,
            site.allocs,
            "{}",
            site.function
        );
        assert_eq!(sum(&rows, "frees") as u64, site.frees, "{}", site.function);
    }
}

/// A shell loop of short children that leak, past `--keep-exited`: the heap statistics of
/// each child that exits leave the kernel's maps (under pid 0 past the first two) and its
/// live blocks are deleted, counted as leaked. Every figure at the fixture's site is exact
/// summed over the runs, its bytes at the peak are one run's under every pid, and maps
/// sized below what all the children need together never fill.
#[test]
fn exited_processes_leave_the_heap_maps() {
    if !bpf_available("exited_processes_leave_the_heap_maps") {
        return;
    }
    // The kernel's maps, which exited processes leave: the BPF heap path's.
    check_exited_processes("alloc-exited", &["--max-heap-stacks", "80", "--no-preload"]);
}

/// The same in-process: the recorder lets each exited process's live blocks go (a live
/// table of 1,000 never fills) and adds those past `--keep-exited` up under pid 0.
#[test]
fn exited_processes_leave_the_recorder() {
    if !bpf_available("exited_processes_leave_the_recorder") {
        return;
    }
    let run = check_exited_processes("alloc-exited-in-process", &[]);
    assert!(
        run.stderr.contains("recorded in the process"),
        "{}",
        run.stderr
    );
}

fn check_exited_processes(name: &str, extra: &[&str]) -> Run {
    const RUNS: u64 = 6;
    let path = quoted(&fixtures::c_fixture("exit_leak"));
    // A run leaks 201 blocks (one the shell allocated before the exec), 1,206 in all;
    // each `sleep` leaks up to ~140 (glibc's locale data) under ~20 stacks. The session
    // sees an exit within 200 ms and retires it within a second more: 1.5 s between runs
    // leave one run, one or two sleeps and the shell in the maps at once (~600 blocks,
    // ~60 stacks' statistics).
    let script = format!("for i in $(seq {RUNS}); do {path}; sleep 1.5; done");
    let mut args = vec![
        "--keep-exited",
        "2",
        "--max-live-blocks",
        "1000",
        "--csv",
        "heap.csv",
        "--report-text",
        "report.txt",
    ];
    args.extend(extra);
    let run = trace(
        name,
        &["alloc"],
        &format!("/bin/sh -c {}", common::shell_quote(&script)),
        &args,
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    run.assert_every_walk_complete();
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(!report.contains("map full"), "{report}");
    assert!(
        run.stderr
            .contains("exited processes counted together as pid 0"),
        "{}",
        run.stderr
    );
    assert!(report.contains("exited processes together"), "{report}");

    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    assert_eq!(sites.len() as u64, RUNS, "{}", run.stdout);
    let site = &sites[0];
    let rows = read_csv(&run, "heap.csv");
    let at_site = rows_of(&rows, site);
    for (column, per_run) in [
        ("allocs", site.allocs),
        ("alloc_space", site.bytes),
        ("frees", site.frees),
        ("leaked_blocks", site.leaked),
        ("leaked_bytes", site.leaked * site.size),
        ("untracked", 0),
    ] {
        assert_eq!(sum(&at_site, column) as u64, RUNS * per_run, "{column}");
    }
    let pids: std::collections::BTreeSet<u32> = at_site.iter().map(|row| row.pid).collect();
    assert!(pids.contains(&0), "no run under pid 0: {pids:?}");
    for row in &at_site {
        let runs = row.value("allocs") as u64 / site.allocs;
        assert!(runs >= 1, "pid {}", row.pid);
        if row.pid != 0 {
            assert_eq!(runs, 1, "pid {} is one run", row.pid);
        }
        assert_eq!(row.value("leaked_blocks") as u64, runs * site.leaked);
        // Every block of a run is live at its peak; pid 0's peak is one run's.
        assert_eq!(
            row.value("peak_bytes") as u64,
            site.bytes,
            "pid {}",
            row.pid
        );
    }
    run
}

/// jemalloc linked into the executable, as tikv-jemallocator links it: its malloc API and
/// its own (mallocx, rallocx, xallocx, sdallocx, dallocx) counted exactly, found without a
/// flag and with `alloc:jemalloc`.
#[test]
fn jemalloc_in_the_executable() {
    if !bpf_available("jemalloc_in_the_executable") {
        return;
    }
    let Some(path) = common::fixture_with(
        "alloc_jemalloc",
        "/usr/include/jemalloc/jemalloc.h",
        &[
            "-Wl,--whole-archive",
            "-l:libjemalloc.a",
            "-Wl,--no-whole-archive",
            "-lstdc++",
            "-lm",
        ],
    ) else {
        return;
    };
    for probe in ["alloc", "alloc:jemalloc"] {
        let run = trace("alloc-jemalloc", &[probe], &quoted(&path), stats_for(probe));
        assert_in_process(probe, &run);
        let rows = read_csv(&run, "heap.csv");
        let sites = check_sites(&run, &rows);
        assert_eq!(sites.len(), 7, "{probe}: {}", run.stdout);
        // Every counted block is jemalloc's: the fixture's libc never allocates.
        assert!(
            rows.iter()
                .filter(|row| row.value("allocs") > 0)
                .all(|row| !row.frames.iter().any(|f| f == "__GI___libc_malloc")),
            "{probe}"
        );
    }
}

/// mimalloc as a shared library: its API and the malloc it overrides, counted exactly,
/// found without a flag and with `alloc:mimalloc`.
#[test]
fn mimalloc_as_a_library() {
    if !bpf_available("mimalloc_as_a_library") {
        return;
    }
    let Some(path) = common::fixture_with(
        "alloc_mimalloc",
        "/usr/include/mimalloc.h",
        &["-Wl,--no-as-needed", "-lmimalloc"],
    ) else {
        return;
    };
    for probe in ["alloc", "alloc:mimalloc"] {
        let run = trace("alloc-mimalloc", &[probe], &quoted(&path), stats_for(probe));
        assert_in_process(probe, &run);
        let rows = read_csv(&run, "heap.csv");
        let sites = check_sites(&run, &rows);
        assert_eq!(sites.len(), 6, "{probe}: {}", run.stdout);
    }
}

/// The `alloc_crates` fixture built with `feature`'s allocator crate as Rust's global
/// allocator (linked statically), profiled with each of `probes`: every site exact, each
/// under the allocator functions its blocks went through (by site, the functions named in
/// `entries` that its stacks enter, innermost; `{p}` stands for jemalloc's prefix), and
/// no walk incomplete.
fn check_allocator_crate(feature: &str, probes: [&str; 2], sites: usize, entries: &[(&str, &str)]) {
    let path = fixtures::cargo_fixture("alloc_crates", feature)
        .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"));
    let entries: Vec<(&str, Vec<String>)> = entries
        .iter()
        .map(|(site, functions)| {
            let mut functions: Vec<String> = functions
                .split(' ')
                .map(|f| f.replace("{p}", "_rjem_"))
                .collect();
            functions.sort_unstable();
            (*site, functions)
        })
        .collect();
    let api: std::collections::BTreeSet<&String> = entries.iter().flat_map(|e| &e.1).collect();
    for probe in probes {
        let run = trace(
            &format!("alloc-crate-{feature}"),
            &[probe],
            &quoted(&path),
            stats_for(probe),
        );
        assert_in_process(probe, &run);
        let rows = read_csv(&run, "heap.csv");
        let found = check_sites(&run, &rows);
        assert_eq!(found.len(), sites, "{probe}: {}", run.stdout);
        for (name, expected) in &entries {
            let site = found
                .iter()
                .find(|s| s.function == format!("alloc_crates::{name}"))
                .unwrap_or_else(|| panic!("no site {name}"));
            let mut entered: Vec<&String> = rows_of(&rows, site)
                .iter()
                .filter(|row| row.value("allocs") > 0)
                .map(|row| {
                    row.frames
                        .iter()
                        .rev()
                        .find(|f| api.contains(f))
                        .unwrap_or_else(|| panic!("{probe}: {name}: {:?}", row.frames))
                })
                .collect();
            entered.sort_unstable();
            entered.dedup();
            assert_eq!(
                entered,
                expected.iter().collect::<Vec<_>>(),
                "{probe}: {name}"
            );
        }
        // The leaks under the leaking site's whole chain from _start.
        let leaky = found.iter().find(|s| s.leaked > 0).unwrap();
        for row in rows_of(&rows, leaky) {
            assert_eq!(row.frames.first().map(String::as_str), Some("_start"));
            assert!(row.frames.contains(&"alloc_crates::main".to_string()));
        }
    }
}

/// tikv-jemallocator as Rust's global allocator: jemalloc built from source and linked
/// into the executable with the `_rjem_` prefix, its functions found without a flag and
/// with `alloc:jemalloc`. Its `GlobalAlloc` calls malloc, calloc and realloc for blocks of
/// malloc's alignment, mallocx (with `MALLOCX_ZERO` for zeroed blocks) and rallocx for
/// the others, and frees every block with sdallocx; the fixture also calls xallocx.
#[test]
fn rust_with_tikv_jemallocator() {
    if !bpf_available("rust_with_tikv_jemallocator") {
        return;
    }
    check_allocator_crate(
        "jemalloc",
        ["alloc", "alloc:jemalloc"],
        9,
        &[
            ("leaky_site", "{p}malloc"),
            ("thread_site", "{p}malloc"),
            ("growing_site", "{p}malloc {p}realloc"),
            ("zeroed_site", "{p}calloc"),
            ("aligned_site", "{p}mallocx"),
            ("aligned_zeroed_site", "{p}mallocx"),
            ("aligned_growing_site", "{p}mallocx {p}rallocx"),
            ("resized_site", "{p}mallocx {p}xallocx"),
        ],
    );
}

/// The mimalloc crate as Rust's global allocator, linked into the executable: its
/// `GlobalAlloc`'s functions (mi_malloc_aligned, mi_zalloc_aligned, mi_realloc_aligned,
/// mi_free) found without a flag and with `alloc:mimalloc`.
#[test]
fn rust_with_the_mimalloc_crate() {
    if !bpf_available("rust_with_the_mimalloc_crate") {
        return;
    }
    check_allocator_crate(
        "mimalloc",
        ["alloc", "alloc:mimalloc"],
        8,
        &[
            ("leaky_site", "mi_malloc_aligned"),
            ("thread_site", "mi_malloc_aligned"),
            ("growing_site", "mi_malloc_aligned mi_realloc_aligned"),
            ("zeroed_site", "mi_zalloc_aligned"),
            ("aligned_site", "mi_malloc_aligned"),
            ("aligned_zeroed_site", "mi_zalloc_aligned"),
            (
                "aligned_growing_site",
                "mi_malloc_aligned mi_realloc_aligned",
            ),
        ],
    );
}

/// `--min-size` and `--max-size`: the sites whose blocks are in the range are exact, the
/// others are not counted, and their frees are not taken for unknown ones.
#[test]
fn a_size_range_counts_its_sites_only() {
    if !bpf_available("a_size_range_counts_its_sites_only") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    let run = alloc_run(
        "alloc-sizes",
        &path,
        &["--min-size", "1050", "--max-size", "1100"],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let rows = read_csv(&run, "heap.csv");
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    let mut counted = 0;
    for site in &sites {
        let rows = rows_of(&rows, site);
        let name = &site.function;
        // The realloc chain's sizes (1021, 2041, 4093) are all outside.
        if (1050..=1100).contains(&site.size) {
            counted += 1;
            assert_eq!(sum(&rows, "allocs") as u64, site.allocs, "{name}");
            assert_eq!(sum(&rows, "frees") as u64, site.frees, "{name}");
            assert_eq!(sum(&rows, "leaked_blocks") as u64, site.leaked, "{name}");
        } else {
            assert_eq!(sum(&rows, "allocs"), 0, "{name}");
        }
    }
    assert_eq!(
        counted, 5,
        "memalign, valloc, pvalloc, aligned_alloc and the leak"
    );
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(
        report.contains("counted: allocations of 1050 to 1100 bytes only")
            && report.contains("unknown frees 0"),
        "{report}"
    );
}

/// SIGUSR1 writes every output as of then and tracing goes on: the leak counted in the
/// snapshot grows by the end.
#[test]
fn sigusr1_writes_the_outputs_as_of_now() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    if !bpf_available("sigusr1_writes_the_outputs_as_of_now") {
        return;
    }
    let path = fixtures::c_fixture("leak_rate");
    let scratch = common::Scratch::new("alloc-sigusr1");
    let session = Command::new(common::binary())
        .args([
            "alloc",
            "-c",
            &quoted(&path),
            "--no-svg",
            "--csv",
            "heap.csv",
        ])
        .current_dir(&scratch.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo-trace");
    let mut session = EndOnDrop(Some(session), libc::SIGINT);
    let pid = session.0.as_ref().unwrap().id() as i32;
    let mut stdout = std::io::BufReader::new(session.0.as_mut().unwrap().stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    assert_eq!(ready, "ready\n");
    let csv = scratch.path("heap.csv");
    assert!(!csv.exists());

    let leaked_in = |text: &str| -> i64 {
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let column = header.iter().position(|h| *h == "leaked_blocks").unwrap();
        lines
            .filter(|line| line.contains("site_leak_tick"))
            .map(|line| line.split(',').nth(column).unwrap().parse::<i64>().unwrap())
            .sum()
    };
    // SIGUSR1 until a snapshot (written whole, then renamed into place) counts more than
    // `floor` leaked blocks: the target leaks one every 10 ms while it is traced.
    let snapshot_above = |floor: i64| -> i64 {
        for _ in 0..300 {
            // SAFETY: kill(2) on our own child.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
            std::thread::sleep(std::time::Duration::from_millis(100));
            if let Ok(text) = std::fs::read_to_string(&csv) {
                let leaked = leaked_in(&text);
                if leaked > floor {
                    return leaked;
                }
            }
        }
        panic!("no snapshot counted more than {floor} leaked blocks");
    };
    let early = snapshot_above(0);
    // Tracing went on after the snapshot.
    let later = snapshot_above(early);

    // SAFETY: as above; the session forwards it to the target, which ends.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let output = session.take().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("on SIGUSR1"), "{stderr}");
    let last = leaked_in(&std::fs::read_to_string(&csv).unwrap());
    assert!(
        last >= later,
        "{last} blocks at the end, {later} in a snapshot"
    );
}

/// The figures of the text report's totals: allocations, bytes, frees, freed bytes,
/// peak, leaked blocks, leaked bytes, temporaries, unknown frees.
fn report_totals(report: &str) -> [i64; 9] {
    let after = |text: &str, key: &str| -> i64 {
        let rest = text
            .split(key)
            .nth(1)
            .unwrap_or_else(|| panic!("no {key:?} in {report}"));
        let number: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        number
            .parse()
            .unwrap_or_else(|_| panic!("{key:?} in {report}"))
    };
    let totals = report
        .lines()
        .find(|l| l.starts_with("allocations "))
        .unwrap_or_else(|| panic!("no totals in {report}"));
    let peak = report
        .lines()
        .find(|l| l.starts_with("peak "))
        .unwrap_or_else(|| panic!("no peak in {report}"));
    [
        after(totals, "allocations"),
        after(totals, "("),
        after(totals, "frees"),
        after(totals.split("frees").nth(1).unwrap(), "("),
        after(peak, "peak"),
        after(peak, "leaked"),
        after(peak.split("leaked").nth(1).unwrap(), "("),
        after(peak, "temporaries"),
        after(peak, "unknown frees"),
    ]
}

/// Whether heaptrack_print runs here; .ci/setup.sh installs it (Debian's heaptrack), so
/// under CI its absence is a failure.
fn heaptrack_print_available() -> bool {
    let works = std::process::Command::new("heaptrack_print")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !works {
        assert!(
            std::env::var_os("CI").is_none(),
            "heaptrack_print is missing: .ci/setup.sh installs heaptrack"
        );
        eprintln!(
            "skipping the heaptrack_print checks: no heaptrack (bash .ci/setup.sh installs it)"
        );
    }
    works
}

/// heaptrack_print's output on `file` with `args`.
fn heaptrack_print(file: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new("heaptrack_print")
        .arg("-f")
        .arg(file)
        .args(args)
        .output()
        .expect("heaptrack_print (the heaptrack package; .ci/setup.sh installs it)");
    assert!(output.status.success(), "heaptrack_print {args:?} failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The sum of a cost over heaptrack_print's flamegraph lines (`frames COST`): exact
/// bytes and counts, where its summary rounds them (60.03K).
fn heaptrack_cost(file: &std::path::Path, cost: &str, scratch: &common::Scratch) -> i64 {
    let stacks = scratch.path(&format!("heaptrack-{cost}.txt"));
    heaptrack_print(
        file,
        &[
            "--flamegraph-cost-type",
            cost,
            "-F",
            stacks.to_str().unwrap(),
        ],
    );
    std::fs::read_to_string(&stacks)
        .unwrap()
        .lines()
        .map(|line| line.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
        .sum()
}

/// The function heaptrack_print names first in one of its top lists.
fn first_named(output: &str, section: &str) -> String {
    let mut lines = output
        .split(section)
        .nth(1)
        .unwrap_or_else(|| panic!("no {section} in {output}"))
        .lines()
        .skip_while(|l| !l.contains(" from"));
    lines.next();
    lines.next().unwrap_or_default().trim().to_string()
}

/// The heap totals of `--json` (written to `heap.json`) are the text report's
/// (`report.txt`): returns those totals and the JSON's heap object.
fn check_json(run: &Run) -> ([i64; 9], serde_json::Value) {
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    let totals = report_totals(&report);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.scratch.path("heap.json")).unwrap()).unwrap();
    let heap = &json["heap"];
    let keys = [
        "allocations",
        "bytes_allocated",
        "frees",
        "bytes_freed",
        "peak_live_bytes",
        "leaked_blocks",
        "leaked_bytes",
        "temporaries",
        "unknown_frees",
    ];
    for (key, total) in keys.iter().zip(totals) {
        assert_eq!(heap[key].as_i64(), Some(total), "{key}: {heap}\n{report}");
    }
    assert_eq!(heap["processes"].as_array().map(Vec::len), Some(1));
    assert_eq!(heap["processes"][0]["pid"], json["pid"]);
    (totals, heap.clone())
}

/// [`check_json`], and heaptrack_print on the `--heaptrack` file `heaptrack` states the
/// same totals: returns them and heaptrack_print's summary (`None` where heaptrack is
/// not installed, outside CI).
fn check_json_and_heaptrack(run: &Run, heaptrack: &str) -> ([i64; 9], Option<String>) {
    let (totals, heap) = check_json(run);
    assert_eq!(heap["sampling"], serde_json::Value::Null);

    // heaptrack_print on the export: the same calls, peak and leaks, exactly.
    if !heaptrack_print_available() {
        return (totals, None);
    }
    let file = run.scratch.path(heaptrack);
    let summary = heaptrack_print(&file, &[]);
    assert!(
        summary.contains(&format!("calls to allocation functions: {} (", totals[0])),
        "{summary}"
    );
    assert_eq!(
        heaptrack_cost(&file, "allocations", &run.scratch),
        totals[0]
    );
    assert_eq!(heaptrack_cost(&file, "peak", &run.scratch), totals[4]);
    assert_eq!(heaptrack_cost(&file, "leaked", &run.scratch), totals[6]);
    (totals, Some(summary))
}

#[test]
fn heaptrack_and_json_state_the_reports_totals() {
    if !bpf_available("heaptrack_and_json_state_the_reports_totals") {
        return;
    }
    let path = fixtures::c_fixture("alloc_c");
    let run = alloc_run(
        "alloc-heaptrack",
        &path,
        &["--heaptrack", "heap.zst", "--json", "heap.json"],
    );
    let rows = read_csv(&run, "heap.csv");
    let sites = check_sites(&run, &rows);
    let (totals, summary) = check_json_and_heaptrack(&run, "heap.zst");
    // The totals are the fixture's own counts.
    let site_sum = |f: fn(&expected::HeapSite) -> u64| sites.iter().map(f).sum::<u64>() as i64;
    assert_eq!(totals[0], site_sum(|s| s.allocs));
    assert_eq!(totals[1], site_sum(|s| s.bytes));
    assert_eq!(totals[2], site_sum(|s| s.frees));
    assert_eq!(totals[4], 3 * 20011, "the fixture's peak");
    assert_eq!(totals[5], site_sum(|s| s.leaked));
    assert_eq!(totals[6], site_sum(|s| s.leaked * s.size));
    assert_eq!(totals[8], 0, "unknown frees");
    let Some(summary) = summary else {
        return;
    };

    // heaptrack's rounded summary says the same: 60033 B is "60.03K", 7651 B "7.65K".
    let kilo = |bytes: i64| format!("{:.2}K", bytes as f64 / 1000.0);
    assert!(
        summary.contains(&format!(
            "peak heap memory consumption: {}",
            kilo(totals[4])
        )) && summary.contains(&format!("total memory leaked: {}", kilo(totals[6]))),
        "{summary}"
    );
    // Temporaries live at the peak (site_peak's, freed at once) replay as one at most.
    let temporaries: i64 = summary
        .split("temporary memory allocations: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    let peak_site = sites.iter().find(|s| s.function == "site_peak").unwrap();
    let at_peak = sum(&rows_of(&rows, peak_site), "temporaries");
    assert!(
        temporaries <= totals[7] && temporaries >= totals[7] - at_peak,
        "{temporaries} temporaries in heaptrack, {} in the report\n{summary}",
        totals[7]
    );

    // Its top lists name the fixture's functions: the most calls, the peak, the leak.
    let file = run.scratch.path("heap.zst");
    let most_calls = sites.iter().max_by_key(|s| s.allocs).unwrap();
    let calls = heaptrack_print(&file, &["-a", "-p", "-l"]);
    assert_eq!(
        first_named(&calls, "MOST CALLS TO ALLOCATION FUNCTIONS"),
        most_calls.function,
        "{calls}"
    );
    assert_eq!(first_named(&calls, "PEAK MEMORY CONSUMERS"), "site_peak");
    assert_eq!(first_named(&calls, "MEMORY LEAKS"), "site_leak", "{calls}");
}

/// The bytes left live by ld.so's and libc's time zone code's own allocations (the link
/// maps of dlopened modules, the zone data): what heaptrack frees with `__libc_freeres`
/// before it counts leaks. The stacks through ld.so or `tzset_internal`.
fn leaked_by_libc(json: &serde_json::Value) -> i64 {
    let types: Vec<&str> = json["value_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    let leaked = types.iter().position(|t| *t == "leaked_bytes").unwrap();
    let freed_by_libc = |location: &serde_json::Value| {
        let mapping = location["mapping"]
            .as_u64()
            .map(|m| &json["mappings"][m as usize]);
        let in_ld_so = mapping
            .and_then(|m| m["path"].as_str())
            .is_some_and(|path| path.contains("/ld-linux"));
        let zones = location["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"] == "tzset_internal");
        in_ld_so || zones
    };
    json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|sample| {
            sample["stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|id| freed_by_libc(&json["locations"][id.as_u64().unwrap() as usize]))
        })
        .map(|sample| sample["values"][leaked].as_i64().unwrap())
        .sum()
}

/// CPython (its own pymalloc arenas, which it maps with mmap, left apart as by default)
/// under cargo-trace and under heaptrack itself: the calls, the peak and the leaked
/// bytes agree within 1%. (heaptrack counts one allocation of its own too: the 72,704
/// bytes libstdc++, which its preloaded library brings, takes at start; and before it
/// counts leaks it frees ld.so's and libc's own blocks with `__libc_freeres`, which an
/// untraced run never frees: cargo-trace counts them leaked, and the comparison leaves
/// them out.)
#[test]
fn cpython_totals_agree_with_heaptrack() {
    if !bpf_available("cpython_totals_agree_with_heaptrack") || !heaptrack_print_available() {
        return;
    }
    let python = std::path::Path::new("/usr/bin/python3");
    if !python.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no /usr/bin/python3 in CI"
        );
        eprintln!("skipping cpython_totals_agree_with_heaptrack: no /usr/bin/python3");
        return;
    }
    let script = "import json\nd = [{'a': i, 'b': str(i) * 3, 'c': [i, i + 1, {'x': i}]} \
                  for i in range(50000)]\ns = json.dumps(d)\nassert json.loads(s) == d\n";
    // One hash seed for every run: the blocks CPython leaves at its exit depend on it.
    // Even so a run now and then leaves a block more or less (heaptrack's leaked bytes
    // also move by up to 128 KiB from run to run): each tool's median of three runs.
    let scratch = common::Scratch::new("alloc-cpython");
    let median = |mut runs: Vec<[i64; 3]>| -> [i64; 3] {
        std::array::from_fn(|i| {
            runs.sort_by_key(|run| run[i]);
            runs[runs.len() / 2][i]
        })
    };
    let ours = median(
        (0..3)
            .map(|round| {
                let json_path = scratch.path(&format!("heap-{round}.json"));
                let output = std::process::Command::new(common::binary())
                    .env("PYTHONHASHSEED", "0")
                    .args(["alloc", "--no-svg", "-q", "--json"])
                    .arg(&json_path)
                    .arg("-c")
                    .arg(format!(
                        "{} -c {}",
                        python.display(),
                        common::shell_quote(script)
                    ))
                    .stdin(std::process::Stdio::null())
                    .output()
                    .expect("run cargo-trace");
                assert!(
                    output.status.success(),
                    "{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                let json: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
                let heap = &json["heap"];
                let [calls, peak, leaked] = ["allocations", "peak_live_bytes", "leaked_bytes"]
                    .map(|key| heap[key].as_i64().unwrap());
                [calls, peak, leaked - leaked_by_libc(&json)]
            })
            .collect(),
    );
    let theirs = median(
        (0..3)
            .map(|round| {
                let recorded = scratch.path(&format!("heaptrack-{round}.python"));
                let status = std::process::Command::new("heaptrack")
                    .env("PYTHONHASHSEED", "0")
                    .arg("-o")
                    .arg(&recorded)
                    .arg(python)
                    .arg("-c")
                    .arg(script)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .expect("heaptrack (.ci/setup.sh installs it)");
                assert!(status.success());
                let file = scratch.path(&format!("heaptrack-{round}.python.zst"));
                ["allocations", "peak", "leaked"].map(|cost| heaptrack_cost(&file, cost, &scratch))
            })
            .collect(),
    );
    for ((name, ours), theirs) in ["calls", "peak", "leaked"].iter().zip(ours).zip(theirs) {
        let apart = (ours - theirs).abs() as f64 / theirs as f64;
        eprintln!(
            "CPython {name}: cargo-trace {ours}, heaptrack {theirs} ({:.2}% apart)",
            apart * 100.0
        );
        assert!(
            apart <= 0.01,
            "{name}: cargo-trace {ours}, heaptrack {theirs}"
        );
    }
}

#[test]
fn heaptrack_needs_the_alloc_probe() {
    let (status, stderr) =
        common::run_args(&["profile:hz:99", "--heaptrack", "h.zst", "-c", "true"]);
    assert!(!status.success());
    assert_eq!(
        stderr.trim(),
        "cargo-trace: error: --heaptrack writes a heap profile: trace with the alloc probe \
         (cargo trace alloc ...)",
    );
}

/// Under the preloaded library each thread logs its frees and tells them with its next
/// allocation. The last frees of a thread that ends without one are told at its end: at
/// the process's `_exit` (no destructor runs), at a thread's return, at a crash and before
/// an exec. Each way, the site's blocks are freed, none leaked.
#[test]
fn a_threads_last_frees_are_told_at_its_end() {
    if !bpf_available("a_threads_last_frees_are_told_at_its_end") {
        return;
    }
    let path = fixtures::c_fixture("free_log");
    for (mode, crashes) in [
        ("exit", false),
        ("thread", false),
        ("crash", true),
        ("exec", false),
    ] {
        let run = alloc_command_run(
            &format!("free-log-{mode}"),
            &format!("{} {mode}", quoted(&path)),
            &[],
        );
        if crashes {
            assert_eq!(
                run.status.code(),
                Some(128 + libc::SIGSEGV),
                "{}",
                run.stderr
            );
        } else {
            assert!(run.status.success(), "{mode}: {}", run.stderr);
        }
        let rows = read_csv(&run, "heap.csv");
        let sites = expected::parse_heap_sites(&run.stdout).unwrap();
        assert_eq!(sites.len(), 1, "{mode}: {}", run.stdout);
        let site = &sites[0];
        let rows = rows_of(&rows, site);
        assert_eq!(sum(&rows, "allocs"), 5, "{mode}");
        assert_eq!(sum(&rows, "frees"), 5, "{mode}: {}", run.stderr);
        assert_eq!(sum(&rows, "leaked_blocks"), 0, "{mode}");
        let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
        assert!(report.contains("unknown frees 0"), "{mode}: {report}");
        assert!(!run.stderr.contains("free logs unread"), "{}", run.stderr);
    }
}

/// A thread frees blocks and keeps them in its log while the allocator hands their
/// addresses to another thread, whose blocks are counted there; the free told later is
/// the first block's, counted once: no reuse without a free, no unknown free, every site
/// exact.
#[test]
fn a_free_told_after_its_address_was_reused() {
    if !bpf_available("a_free_told_after_its_address_was_reused") {
        return;
    }
    let path = fixtures::c_fixture("free_log");
    let run = alloc_command_run("free-log-cross", &format!("{} cross", quoted(&path)), &[]);
    let rows = read_csv(&run, "heap.csv");
    let sites = check_sites(&run, &rows);
    assert_eq!(sites.len(), 3, "{}", run.stdout);
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(report.contains("unknown frees 0"), "{report}");
    assert!(!report.contains("reused without a free"), "{report}");
    assert!(
        !run.stderr.contains("reused without a free"),
        "{}",
        run.stderr
    );
}
