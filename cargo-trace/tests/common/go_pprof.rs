//! `go tool pprof`, the reader the tests check the pprof output with.

use std::process::Command;

/// Whether `go tool pprof` runs here; .ci/setup.sh installs it (Debian's golang-go), so
/// under CI its absence is a failure.
pub fn available() -> bool {
    let works = Command::new("go")
        .args(["tool", "pprof", "-h"])
        .output()
        .is_ok_and(|output| !output.stdout.is_empty() || !output.stderr.is_empty());
    if !works {
        assert!(
            std::env::var_os("CI").is_none(),
            "go tool pprof is missing: .ci/setup.sh installs golang-go"
        );
        eprintln!("skipping the go tool pprof checks: no `go` (bash .ci/setup.sh installs it)");
    }
    works
}

/// `go tool pprof ARGS FILE`'s output; fails the test if pprof does.
pub fn run(args: &[&str], file: &std::path::Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // No symbolization service and no binaries: the profile holds every name.
        .env("PPROF_BINARY_PATH", "/nonexistent")
        .output()
        .expect("run go tool pprof");
    assert!(
        output.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

/// One row of `go tool pprof -top`: flat and cum as printed (`202600B` with `-unit=B`),
/// and the function.
#[derive(Debug)]
pub struct TopRow {
    pub flat: String,
    pub cum: String,
    pub function: String,
}

/// The rows of `go tool pprof -top`'s output, after its `flat  flat%  ...` header.
pub fn top_rows(top: &str) -> Vec<TopRow> {
    top.lines()
        .skip_while(|line| !line.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 6).then(|| TopRow {
                flat: fields[0].to_string(),
                cum: fields[3].to_string(),
                function: fields[5..].join(" "),
            })
        })
        .collect()
}

/// The row of `function` in `go tool pprof -top`'s output.
pub fn top_row(top: &str, function: &str) -> TopRow {
    top_rows(top)
        .into_iter()
        .find(|row| row.function == function)
        .unwrap_or_else(|| panic!("no row of {function} in:\n{top}"))
}
