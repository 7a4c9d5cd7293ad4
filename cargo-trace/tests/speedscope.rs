//! The `--speedscope` files as the speedscope app reads them: the app of the npm registry
//! (`speedscope-app/`, installed by .ci/setup.sh with `npm ci`), served by a small HTTP
//! server of the test's own on 127.0.0.1, opened in Debian's chromium, headless, driven
//! by playwright-core (`speedscope-app/read.mjs`). The app lists every profile of the file
//! under its name, and its sandwich view (an HTML table, where the flame graphs are
//! canvas) shows each profile's functions. The writer's golden files are checked this way
//! without BPF; a CPU and a heap profile of runs with several processes with BPF.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cargo_trace_tests::expected;
use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, shell_quote, trace};

/// The app's files and the driver that reads what it drew.
struct App {
    release: PathBuf,
    driver: PathBuf,
}

/// The app where .ci/setup.sh installs it, with node and chromium to open it; `None`
/// (with the reason printed) where something is missing outside CI. Under CI a missing
/// piece is a failure.
fn app() -> Option<App> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/speedscope-app");
    let release = dir.join("node_modules/speedscope/dist/release");
    let missing = if !release.join("index.html").exists() {
        Some("the speedscope app (npm ci in cargo-trace/tests/speedscope-app)")
    } else if !dir.join("node_modules/playwright-core").exists() {
        Some("playwright-core (npm ci in cargo-trace/tests/speedscope-app)")
    } else if Command::new("node").arg("--version").output().is_err() {
        Some("node")
    } else if !Path::new(&chromium()).exists() {
        Some("chromium")
    } else {
        None
    };
    if let Some(missing) = missing {
        assert!(
            std::env::var_os("CI").is_none(),
            "{missing} is missing: .ci/setup.sh installs it"
        );
        eprintln!("skipping the speedscope app checks: no {missing} (bash .ci/setup.sh)");
        return None;
    }
    Some(App {
        release,
        driver: dir.join("read.mjs"),
    })
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string())
}

/// Serves the files under `root` and `profile` as `/profile.json` on 127.0.0.1, for as
/// long as the test runs: returns the port.
fn serve(root: PathBuf, profile: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (root, profile) = (root.clone(), profile.clone());
            std::thread::spawn(move || answer(stream, &root, &profile));
        }
    });
    port
}

/// Answers one request: GET of a file, 404 for anything else.
fn answer(mut stream: TcpStream, root: &Path, profile: &Path) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut request = String::new();
    let mut reader = BufReader::new(&stream);
    if reader.read_line(&mut request).is_err() {
        return;
    }
    // The headers, up to the blank line.
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
        header.clear();
    }
    let path = request
        .strip_prefix("GET ")
        .and_then(|rest| rest.split_whitespace().next())
        .map(|path| path.split(['?', '#']).next().unwrap_or(path));
    let file = match path {
        Some("/profile.json") => Some(profile.to_path_buf()),
        Some(path) if !path.contains("..") => Some(root.join(path.trim_start_matches('/'))),
        _ => None,
    };
    let response = file.and_then(|file| Some((std::fs::read(&file).ok()?, file)));
    let _ = match response {
        Some((body, file)) => {
            let kind = match file.extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html; charset=utf-8",
                Some("js") => "text/javascript",
                Some("css") => "text/css",
                Some("json") => "application/json",
                Some("wasm") => "application/wasm",
                Some("woff2") => "font/woff2",
                Some("png") => "image/png",
                _ => "application/octet-stream",
            };
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            )
            .and_then(|()| stream.write_all(&body))
        }
        None => stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
}

/// One profile as the app drew it: the name in its toolbar, and its sandwich table's
/// rows (function, total as the app prints it).
#[derive(Debug)]
struct Drawn {
    name: String,
    rows: Vec<(String, String)>,
}

impl Drawn {
    fn functions(&self) -> BTreeSet<&str> {
        self.rows.iter().map(|(f, _)| f.as_str()).collect()
    }

    /// The total the app prints for `function`.
    fn total(&self, function: &str) -> &str {
        self.rows
            .iter()
            .find(|(f, _)| f == function)
            .map(|(_, total)| total.as_str())
            .unwrap_or_else(|| panic!("no {function} in {self:?}"))
    }
}

/// Opens `file` in the app: the position (from 1) of the profile it opened with, and
/// every profile as it drew it. Screenshots go to the target's artifacts, under `name`.
fn open_in_app(app: &App, file: &Path, name: &str) -> (usize, Vec<Drawn>) {
    let port = serve(app.release.clone(), file.to_path_buf());
    let base = format!("http://127.0.0.1:{port}");
    let url = format!("{base}/index.html#profileURL={base}/profile.json&view=sandwich");
    let user_data = tempfile::tempdir().unwrap();
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("artifacts")
        .join(format!("speedscope-{name}"));
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let output = Command::new("node")
        .arg(&app.driver)
        .arg(&url)
        .arg(user_data.path())
        .arg(&shots)
        .env("CHROMIUM", chromium())
        // A file of 100 MB takes the app some 15 s to import on a quiet machine.
        .env("SPEEDSCOPE_TIMEOUT_MS", "180000")
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the speedscope app on {}: {}\n{stdout}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("speedscope screenshots: {}", shots.display());
    let mut lines = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"));
    let opened = lines.next().expect("the opened profile")["opened"]
        .as_u64()
        .unwrap() as usize;
    let drawn = lines
        .map(|profile| Drawn {
            name: profile["name"].as_str().unwrap_or_default().to_string(),
            rows: profile["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    (
                        row["symbol"].as_str().unwrap().to_string(),
                        row["total"].as_str().unwrap().to_string(),
                    )
                })
                .collect(),
        })
        .collect();
    (opened, drawn)
}

/// The app drew every profile of `file` under its name, in order, opened with the file's
/// active one, each with its stacks' functions (all of them where the table shows them
/// all, none that its stacks lack). Returns what it drew.
fn check_drawn(app: &App, file: &Path, name: &str) -> Vec<Drawn> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let (opened, drawn) = open_in_app(app, file, name);
    let profiles = json["profiles"].as_array().unwrap();
    let names: Vec<&str> = profiles
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let drawn_names: Vec<&str> = drawn.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(drawn_names, names);
    assert_eq!(
        opened,
        json["activeProfileIndex"].as_u64().unwrap() as usize + 1
    );
    let frames = json["shared"]["frames"].as_array().unwrap();
    for (profile, drawn) in profiles.iter().zip(&drawn) {
        let functions: BTreeSet<&str> = profile["samples"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|stack| stack.as_array().unwrap())
            .map(|id| {
                frames[id.as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        let shown = drawn.functions();
        assert!(shown.is_subset(&functions), "{}: {shown:?}", drawn.name);
        // The table shows about 35 rows in the driver's window.
        if functions.len() <= 30 {
            assert_eq!(shown, functions, "{}", drawn.name);
        } else {
            assert!(shown.len() >= 30, "{}: {shown:?}", drawn.name);
        }
    }
    drawn
}

/// A CPU profile at the size of a real one: an interpreter 300 frames deep, 100 k
/// distinct stacks (ten scripts' call chains, each ending in its own ten functions).
fn interpreter_profile() -> profile::Profile {
    use profile::{Frame, Location, Profile, Sample, ValueType};
    const STACKS: usize = 100_000;
    const DEPTH: usize = 300;
    const TAIL: usize = 10;
    let location = |address: usize, function: String| Location {
        address: address as u64,
        mapping: None,
        frames: vec![Frame::named(function)],
        kernel: false,
    };
    // The chains: ten of 290 frames; the tails: 20 functions at each of the last 10 depths.
    let mut locations: Vec<Location> = Vec::new();
    for chain in 0..10 {
        for depth in 0..DEPTH - TAIL {
            let name = format!("_PyEval_EvalFrameDefault (script {chain}, depth {depth})");
            locations.push(location(locations.len(), name));
        }
    }
    let tails = locations.len();
    for depth in 0..TAIL {
        for function in 0..20 {
            let name = format!("builtin_{function}_at_{depth}");
            locations.push(location(locations.len(), name));
        }
    }
    let samples = (0..STACKS)
        .map(|s| {
            let chain = s % 10;
            let mut stack: Vec<usize> = (0..DEPTH - TAIL)
                .map(|depth| chain * (DEPTH - TAIL) + depth)
                .collect();
            let mut digits = s / 10;
            for depth in 0..TAIL {
                stack.push(tails + depth * 20 + digits % 20);
                digits /= 20;
            }
            stack.reverse();
            Sample {
                probe: 0,
                pid: 42,
                stack,
                truncated: None,
                values: vec![1, 10_101_010],
            }
        })
        .collect();
    Profile {
        value_types: vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        probes: vec!["profile:hz:99".into()],
        samples,
        locations,
        ..Profile::default()
    }
}

/// How the app prints a number of bytes.
fn app_bytes(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.2} KB", bytes as f64 / 1024.0),
        _ => format!("{:.2} MB", bytes as f64 / 1_048_576.0),
    }
}

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../profile/tests/data")
        .join(name)
}

/// The writer's golden files (profile/tests/data, each equal to the writer's output in
/// the profile crate's tests) in the app.
#[test]
fn the_golden_files_in_the_app() {
    let Some(app) = app() else {
        return;
    };
    check_drawn(&app, &golden("example.speedscope.json"), "golden-example");

    let heap = check_drawn(&app, &golden("heap-example.speedscope.json"), "golden-heap");
    let profile = |name: &str| {
        heap.iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no profile {name}: {heap:?}"))
    };
    let leaked = profile("leaky (pid 42) — bytes leaked");
    assert_eq!(
        leaked.total("leak_site"),
        format!("{} (100%)", app_bytes(150 * 1013))
    );
    assert!(!leaked.functions().contains("churn"));
    assert!(profile("pid 43 — bytes leaked")
        .functions()
        .contains("mixed_sizes"));
}

/// A profile of 100 k stacks 300 frames deep (a file of ~110 MB) loads in the app, and
/// the app draws it.
#[test]
fn a_profile_at_real_size_in_the_app() {
    let Some(app) = app() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("big.speedscope.json");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    profile::writers::speedscope::write(
        &interpreter_profile(),
        profile::writers::Weighting::default(),
        &mut out,
    )
    .unwrap();
    out.into_inner().unwrap();
    let (_, drawn) = open_in_app(&app, &file, "real-size");
    assert_eq!(drawn.len(), 1);
    assert_eq!(drawn[0].name, "pid 42 — CPU time");
    let functions = drawn[0].functions();
    assert!(
        functions
            .iter()
            .any(|f| f.starts_with("_PyEval_EvalFrameDefault (script ")),
        "{functions:?}"
    );
}

/// `cargo trace PROBE --speedscope` on `/bin/sh -c SCRIPT`, and its file in the app
/// ([`check_drawn`]).
fn shell_in_app(app: &App, name: &str, probe: &str, script: &str) -> (common::Run, Vec<Drawn>) {
    let file = format!("{name}.speedscope.json");
    let run = trace(
        &format!("speedscope-{name}"),
        &[probe],
        &format!("/bin/sh -c {}", shell_quote(script)),
        &["--speedscope", &file],
    );
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    let drawn = check_drawn(app, &run.scratch.path(&file), name);
    (run, drawn)
}

/// A CPU profile of a shell and the two children it starts: each child's profile
/// shows the fixture's hot function.
#[test]
fn a_cpu_profile_per_process_in_the_app() {
    if !bpf_available("speedscope cpu") {
        return;
    }
    let Some(app) = app() else {
        return;
    };
    let fixture = quoted(&fixtures::rust_fixture("cpu_split"));
    let script = format!("{fixture} 0.3 & {fixture} 0.3; wait");
    let (_, drawn) = shell_in_app(&app, "cpu", "profile:hz:99", &script);
    let hot: Vec<&str> = drawn
        .iter()
        .filter(|d| d.functions().contains("cpu_split::hot"))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(hot.len(), 2, "{drawn:?}");
    for name in hot {
        assert!(
            name.starts_with("pid ") && name.ends_with(" — CPU time"),
            "{name}"
        );
    }
}

/// A heap profile of a shell that runs a leaking fixture twice: each run's process has
/// its own profiles, its leak at the site to the byte.
#[test]
fn a_heap_profile_per_process_in_the_app() {
    if !bpf_available("speedscope heap") {
        return;
    }
    let Some(app) = app() else {
        return;
    };
    let fixture = quoted(&fixtures::c_fixture("exit_leak"));
    let script = format!("{fixture}; {fixture}");
    let (run, drawn) = shell_in_app(&app, "heap", "alloc", &script);
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    assert_eq!(sites.len(), 2, "{}", run.stdout);
    let site = &sites[0];
    let leaks: Vec<&Drawn> = drawn
        .iter()
        .filter(|d| d.name.ends_with(" — bytes leaked") && d.functions().contains(&*site.function))
        .collect();
    assert_eq!(leaks.len(), 2, "{drawn:?}");
    for leak in leaks {
        let total = leak.total(&site.function);
        assert!(
            total.starts_with(&app_bytes(site.leaked * site.size)),
            "{}: {total}",
            leak.name
        );
    }
}
