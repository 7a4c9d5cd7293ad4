//! Runs the cargo-trace binary on fixture programs and reads what it wrote.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

pub mod go_pprof;

/// Whether the tests that load BPF programs can run; prints why not when they can't.
/// CI runs as root, where they always run: under `CI=true` a missing root fails the test.
pub fn bpf_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var_os("CI").is_none_or(|ci| ci != "true"),
            "{test}: loading BPF programs needs root, and CI must run as root"
        );
        eprintln!("skipping {test}: loading BPF programs needs root");
    }
    root
}

/// A private scratch directory (unpredictable name, mode 0700), removed on drop.
pub struct Scratch(pub tempfile::TempDir);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix(&format!("cargo-trace-e2e-{name}-"))
            .tempdir()
            .expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    pub fn dir(&self) -> &Path {
        self.0.path()
    }
}

/// One finished cargo-trace run.
pub struct Run {
    pub status: ExitStatus,
    /// The target's stdout (cargo-trace passes it through).
    pub stdout: String,
    pub stderr: String,
    pub svg: PathBuf,
    pub folded_path: PathBuf,
    pub scratch: Scratch,
}

impl Run {
    /// The folded stacks written with `--folded`.
    pub fn folded(&self) -> Folded {
        let text = std::fs::read_to_string(&self.folded_path).unwrap_or_else(|e| {
            panic!(
                "no folded file {}: {e}\nstderr:\n{}",
                self.folded_path.display(),
                self.stderr
            )
        });
        Folded::parse(&text)
    }

    /// The summary says that every walk reached the end of its stack.
    pub fn assert_every_walk_complete(&self) {
        assert!(
            self.stderr
                .contains("every stack walk reached the end of the stack"),
            "some walks failed: {}",
            self.stderr
        );
    }

    /// The summary's event count.
    pub fn summary_events(&self) -> u64 {
        let line = self
            .stderr
            .lines()
            .find(|line| line.contains(" events, "))
            .unwrap_or_else(|| panic!("no summary line in:\n{}", self.stderr));
        line.trim_start_matches("cargo-trace: ")
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("bad summary line {line:?}"))
    }
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_cargo-trace")
}

/// Runs `cargo-trace PROBES... -c COMMAND --folded F -o SVG EXTRA...` in a scratch directory.
pub fn trace(name: &str, probes: &[&str], command: &str, extra: &[&str]) -> Run {
    let scratch = Scratch::new(name);
    let svg = scratch.path("out.svg");
    let folded_path = scratch.path("out.folded");
    let mut cmd = Command::new(binary());
    cmd.args(probes)
        .arg("-c")
        .arg(command)
        .arg("-o")
        .arg(&svg)
        .arg("--folded")
        .arg(&folded_path)
        .args(extra)
        .current_dir(scratch.dir())
        .stdin(Stdio::null());
    let output = cmd.output().expect("run cargo-trace");
    let run = Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        svg,
        folded_path,
        scratch,
    };
    eprintln!(
        "cargo-trace {probes:?} -c {command:?}: {}",
        run.stderr.trim_end()
    );
    run
}

/// Runs cargo-trace with `args` only, for error cases.
pub fn run_args(args: &[&str]) -> (ExitStatus, String) {
    let scratch = Scratch::new("args");
    let output = Command::new(binary())
        .args(args)
        .current_dir(scratch.dir())
        .stdin(Stdio::null())
        .output()
        .expect("run cargo-trace");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Folded stacks: frames root first, with their counts.
pub struct Folded {
    pub stacks: Vec<(Vec<String>, u64)>,
}

impl Folded {
    pub fn parse(text: &str) -> Folded {
        let stacks = text
            .lines()
            .map(|line| {
                let (stack, count) = line
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
                let count = count
                    .parse()
                    .unwrap_or_else(|_| panic!("bad count in folded line {line:?}"));
                (stack.split(';').map(str::to_string).collect(), count)
            })
            .collect();
        Folded { stacks }
    }

    pub fn total(&self) -> u64 {
        self.stacks.iter().map(|(_, count)| count).sum()
    }

    /// Events whose stack holds a frame named `function`.
    pub fn count_with(&self, function: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, count)| count)
            .sum()
    }

    /// Reads a folded file.
    pub fn read(path: &Path) -> Folded {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("no folded file {}: {e}", path.display()));
        Folded::parse(&text)
    }
}

/// A path quoted as one word of a `-c` command.
pub fn quoted(path: &Path) -> String {
    shell_quote(&path.display().to_string())
}

pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// RFC 4180 fields of one line (quoted fields may hold commas and doubled quotes).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// Reads cargo-trace's `stderr` until it says it is tracing (a loaded machine may take
/// seconds); what it said up to there. Fails if it ends first.
pub fn await_tracing(stderr: &mut impl std::io::BufRead) -> String {
    let mut said = String::new();
    while !said.contains("tracing process") {
        said.clear();
        assert!(
            stderr.read_line(&mut said).unwrap() > 0,
            "cargo-trace ended"
        );
    }
    said
}

/// A C fixture built with `flags` (a library of .ci/setup.sh's linked in), or `None`
/// (with the reason printed) where the library's `header` is missing outside CI; under
/// `CI=true` a missing one fails.
pub fn fixture_with(name: &str, header: &str, flags: &[&str]) -> Option<PathBuf> {
    if !Path::new(header).exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{header} is missing: .ci/setup.sh installs it"
        );
        eprintln!("skipping {name}: no {header} (bash .ci/setup.sh installs it)");
        return None;
    }
    Some(
        cargo_trace_tests::fixtures::build(cargo_trace_tests::fixtures::Lang::C, name, flags)
            .unwrap_or_else(|error| panic!("building {name}: {error}")),
    )
}
