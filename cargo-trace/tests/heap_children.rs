//! The heap of every process the target starts, on the BPF path (`--no-preload`): each
//! child's allocator is found before it allocates, whatever it brings (jemalloc or
//! mimalloc linked into it, a library it dlopens), and the profile says which allocator
//! was counted in which process.

mod common;
mod heap_sites;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cargo_trace_tests::fixtures;
use common::{bpf_available, quoted, trace, Run, Scratch};
use heap_sites::{check_sites, read_csv, Row};

/// `alloc --no-preload` on `command`, with the CSV, the JSON and the text report.
fn alloc_run(name: &str, command: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "--no-preload",
        "--csv",
        "heap.csv",
        "--json",
        "heap.json",
        "--report-text",
        "report.txt",
    ];
    args.extend(extra);
    trace(name, &["alloc"], command, &args)
}

fn json(run: &Run) -> serde_json::Value {
    let text = std::fs::read_to_string(run.scratch.path("heap.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The pid whose rows hold the fixture's sites.
fn pid_of_sites(rows: &[Row], function: &str) -> u32 {
    let pids: std::collections::BTreeSet<u32> = rows
        .iter()
        .filter(|row| row.frames.iter().any(|f| f == function))
        .map(|row| row.pid)
        .collect();
    assert_eq!(pids.len(), 1, "{function} in {pids:?}");
    pids.into_iter().next().unwrap()
}

/// The allocators the JSON names for process `pid`, as `name/prefix/object` texts.
fn allocators_in(json: &serde_json::Value, pid: u32) -> Vec<serde_json::Value> {
    let processes = json["heap"]["processes"].as_array().unwrap();
    let process = processes
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no heap process {pid} in {processes:?}"));
    process["allocators"].as_array().unwrap().clone()
}

/// Every site of a run's child exact, and the child's allocator named (its `name`,
/// `prefix` and the object carrying it) in the JSON, the text report and the summary.
fn check_child(run: &Run, site: &str, name: &str, prefix: Option<&str>, object: &Path) {
    let rows = read_csv(run, "heap.csv");
    check_sites(run, &rows);
    let child = pid_of_sites(&rows, site);
    let json = json(run);
    let allocators = allocators_in(&json, child);
    let object = std::fs::canonicalize(object).unwrap();
    let found = allocators
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {allocators:?}"));
    assert_eq!(found["prefix"].as_str(), prefix, "{found}");
    assert_eq!(found["counted_by"], "functions", "{found}");
    let counted = std::fs::canonicalize(found["object"].as_str().unwrap()).unwrap();
    assert_eq!(counted, object, "{found}");
    assert!(
        allocators.iter().any(|a| a["name"] == "libc"),
        "{allocators:?}"
    );
    let text = found["text"].as_str().unwrap().to_string();
    let report = std::fs::read_to_string(run.scratch.path("report.txt")).unwrap();
    assert!(
        report.contains(&format!("process {child} (")) && report.contains(&text),
        "{text} not in {report}"
    );
    let summary = run
        .stderr
        .lines()
        .find(|line| line.contains(" events, "))
        .unwrap();
    assert!(
        summary.contains("allocators: ") && summary.contains(&text),
        "{summary}"
    );
    assert!(!run.stderr.contains("probed only after"), "{}", run.stderr);
}

fn alloc_crates(feature: &str) -> PathBuf {
    fixtures::cargo_fixture("alloc_crates", feature)
        .unwrap_or_else(|error| panic!("building alloc_crates with {feature}: {error}"))
}

/// A C parent execs a Rust child whose global allocator is tikv-jemallocator (jemalloc
/// linked in with the `_rjem_` prefix), then one whose allocator is the mimalloc crate:
/// each child's sites exact under `--no-preload`, its allocator named.
#[test]
fn rust_children_of_a_c_parent_count_exactly() {
    if !bpf_available("rust_children_of_a_c_parent_count_exactly") {
        return;
    }
    let parent = fixtures::c_fixture("exec_parent");
    for (feature, name, prefix) in [
        ("jemalloc", "jemalloc", Some("_rjem_")),
        ("mimalloc", "mimalloc", None),
    ] {
        let child = alloc_crates(feature);
        let run = alloc_run(
            &format!("children-{feature}"),
            &format!("{} {}", quoted(&parent), quoted(&child)),
            &[],
        );
        check_child(&run, "alloc_crates::leaky_site", name, prefix, &child);
        eprintln!("{}", run.stdout.lines().last().unwrap_or(""));
    }
}

/// The library a child dlopens brings its own allocator (mimalloc's shared library,
/// called through dlsym): found when ld.so has mapped it, before the child calls it.
#[test]
fn a_child_dlopens_its_allocator() {
    if !bpf_available("a_child_dlopens_its_allocator") {
        return;
    }
    let library = Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    if !library.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing: .ci/setup.sh installs it",
            library.display()
        );
        eprintln!(
            "skipping a_child_dlopens_its_allocator: no {}",
            library.display()
        );
        return;
    }
    let parent = fixtures::c_fixture("exec_parent");
    let child = fixtures::c_fixture("dlopen_alloc");
    let run = alloc_run(
        "children-dlopen",
        &format!("{} {}", quoted(&parent), quoted(&child)),
        &[],
    );
    check_child(&run, "site_plugin_malloc", "mimalloc", None, library);
}

/// `-p` on a parent attached before it execs its child: the child's allocator (jemalloc,
/// linked into it) found at its start, every site exact.
#[test]
fn an_attached_parent_execs_its_child() {
    if !bpf_available("an_attached_parent_execs_its_child") {
        return;
    }
    let parent = fixtures::c_fixture("exec_parent");
    let child = alloc_crates("jemalloc");
    let mut target = Command::new(&parent)
        .arg("--wait")
        .arg(&child)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target_out = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    target_out.read_line(&mut line).unwrap();
    let pid: u32 = line
        .strip_prefix("waiting ")
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));

    let scratch = Scratch::new("children-attached");
    let mut session = Command::new(common::binary())
        .args(["alloc", "--no-preload", "-p", &pid.to_string(), "--no-svg"])
        .args(["--csv", "heap.csv", "--json", "heap.json"])
        .args(["--report-text", "report.txt"])
        .current_dir(scratch.dir())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(session.stderr.take().unwrap());
    let said = common::await_tracing(&mut stderr);
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut target_out, &mut stdout).unwrap();
    target.wait().unwrap();
    // The attached process is gone: the session ends by itself.
    let status = session.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let run = Run {
        status,
        stdout,
        stderr: format!("{said}{rest}"),
        svg: scratch.path("none.svg"),
        folded_path: scratch.path("none.folded"),
        scratch,
    };
    eprintln!("{}", run.stderr);
    check_child(
        &run,
        "alloc_crates::leaky_site",
        "jemalloc",
        Some("_rjem_"),
        &child,
    );
}

/// rustc, if this machine has it.
fn rustc() -> Option<PathBuf> {
    let output = Command::new("rustc").arg("--print=sysroot").output().ok()?;
    let sysroot = String::from_utf8(output.stdout).ok()?;
    let rustc = Path::new(sysroot.trim()).join("bin/rustc");
    if rustc.exists() {
        return Some(rustc);
    }
    eprintln!("skipping: rustc is not installed");
    None
}

/// The allocations counted in each process of a run whose executable is `executable`.
fn allocations_of(run: &Run, executable: &Path) -> Vec<u64> {
    let json = json(run);
    let executable = std::fs::canonicalize(executable).unwrap();
    let pids: Vec<u64> = json["heap"]["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| {
            entry["executable"]
                .as_str()
                .and_then(|e| std::fs::canonicalize(e).ok())
                .is_some_and(|e| e == executable)
        })
        .map(|entry| entry["pid"].as_u64().unwrap())
        .collect();
    let mut counts: Vec<u64> = json["heap"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| pids.contains(&p["pid"].as_u64().unwrap()))
        .map(|p| p["allocations"].as_u64().unwrap())
        .collect();
    counts.sort_unstable();
    counts
}

fn within_one_percent(a: u64, b: u64) -> bool {
    a.abs_diff(b) * 100 <= a.max(b)
}

/// No leaked block (anonymous mappings counted as blocks, `--mmap`) is an allocator's own
/// mapping: the innermost frame of each leaked stack that is the program's (not in an
/// object that carries an allocator apart from the program, as libc.so does) is not
/// inside an allocator linked into the program (jemalloc's and mimalloc's functions
/// that map their own memory).
fn no_allocator_mapping_leaked(run: &Run) {
    const ALLOCATORS_OWN: [&str; 5] = [
        "pages_map",
        "os_pages_map",
        "_mi_os_alloc",
        "mi_unix_mmap",
        "mi_os_prim_alloc",
    ];
    let json = json(run);
    let executables: Vec<&str> = json["heap"]["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|entry| entry["executable"].as_str())
        .collect();
    // Objects that are allocators and nothing else.
    let allocator_objects: Vec<&str> = json["heap"]["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|entry| entry["allocators"].as_array().unwrap())
        .filter_map(|a| a["object"].as_str())
        .filter(|object| !executables.contains(object))
        .collect();
    let value_types = json["value_types"].as_array().unwrap();
    let leaked = value_types
        .iter()
        .position(|t| t["type"] == "leaked_blocks")
        .unwrap();
    let locations = json["locations"].as_array().unwrap();
    let mappings = json["mappings"].as_array().unwrap();
    let mut checked = 0;
    for sample in json["samples"].as_array().unwrap() {
        if sample["values"][leaked].as_i64().unwrap() <= 0 {
            continue;
        }
        let program_frame = sample["stack"].as_array().unwrap().iter().find_map(|id| {
            let location = &locations[id.as_u64().unwrap() as usize];
            let path = location["mapping"]
                .as_u64()
                .and_then(|m| mappings[m as usize]["path"].as_str())
                .unwrap_or("");
            let in_allocator = allocator_objects.iter().any(|object| {
                std::fs::canonicalize(object).ok() == std::fs::canonicalize(path).ok()
            }) || path.contains("/ld-linux");
            (!in_allocator).then(|| location["frames"][0]["function"].as_str().unwrap_or(""))
        });
        let Some(function) = program_frame else {
            continue;
        };
        checked += 1;
        assert!(
            !ALLOCATORS_OWN.contains(&function),
            "a leak mapped by the allocator, at {function}: {sample}"
        );
    }
    assert!(checked > 0, "no leaked stack in {}", run.stderr);
}

/// rustc compiling one file, launched directly and as the child of `sh -c '...; true'`:
/// its jemalloc found both ways, the allocations counted within 1% of each other, and
/// (with `--mmap`) none of its leaks an allocator's own mapping.
#[test]
fn rustc_as_a_shell_child_counts_as_run_directly() {
    if !bpf_available("rustc_as_a_shell_child_counts_as_run_directly") {
        return;
    }
    let Some(rustc) = rustc() else {
        return;
    };
    let scratch = Scratch::new("children-rustc-source");
    let source = scratch.path("main.rs");
    std::fs::write(
        &source,
        "fn main() { let v: Vec<String> = (0..100).map(|i| i.to_string()).collect(); \
         println!(\"{}\", v.join(\",\")); }\n",
    )
    .unwrap();
    let compile = |out: &str| {
        format!(
            "{} --edition 2021 -o {} {}",
            quoted(&rustc),
            quoted(&scratch.path(out)),
            quoted(&source)
        )
    };
    let direct = alloc_run("children-rustc-direct", &compile("direct"), &["--mmap"]);
    assert!(direct.status.success(), "{}", direct.stderr);
    let shell = format!(
        "/bin/sh -c {}",
        common::shell_quote(&format!("{}; true", compile("shell")))
    );
    let child = alloc_run("children-rustc-shell", &shell, &["--mmap"]);
    assert!(child.status.success(), "{}", child.stderr);
    let direct_counts = allocations_of(&direct, &rustc);
    let child_counts = allocations_of(&child, &rustc);
    eprintln!("rustc's allocations: direct {direct_counts:?}, as a shell's child {child_counts:?}");
    assert_eq!(direct_counts.len(), 1);
    assert_eq!(child_counts.len(), 1);
    assert!(
        within_one_percent(direct_counts[0], child_counts[0]),
        "direct {direct_counts:?}, as a child {child_counts:?}"
    );
    for run in [&direct, &child] {
        no_allocator_mapping_leaked(run);
        assert!(run.stderr.contains("jemalloc in "), "{}", run.stderr);
    }
}

/// `cargo build` of a fresh crate with one path dependency: each rustc process it starts
/// counted within 1% of the same rustc command run directly, and none of the leaks an
/// allocator's own mapping (`--mmap`), on the BPF path and in the process (rustc's
/// jemalloc hooked in each rustc process cargo starts).
#[test]
fn cargo_build_counts_its_rustc_processes_as_run_directly() {
    if !bpf_available("cargo_build_counts_its_rustc_processes_as_run_directly") {
        return;
    }
    let Some(rustc) = rustc() else {
        return;
    };
    let scratch = Scratch::new("children-cargo");
    let root = scratch.dir().to_path_buf();
    let write = |path: &str, text: &str| {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "Cargo.toml",
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\ndep = { path = \"dep\" }\n\n[workspace]\n",
    );
    write(
        "src/main.rs",
        "fn main() { println!(\"{}\", dep::words(50).join(\" \")); }\n",
    );
    write(
        "dep/Cargo.toml",
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    write(
        "dep/src/lib.rs",
        "pub fn words(n: usize) -> Vec<String> { (0..n).map(|i| format!(\"w{i}\")).collect() }\n",
    );
    let cargo = |args: &[&str]| {
        Command::new("cargo")
            .args(args)
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env_remove("RUSTFLAGS")
            .output()
            .expect("run cargo")
    };
    // Once untraced: the commands it runs, and rustc's answers to cargo's questions
    // cached (target/.rustc_info.json), so that a build runs only the two compilations.
    let built = cargo(&["build", "-v"]);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let commands: Vec<String> = String::from_utf8_lossy(&built.stderr)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Running `"))
        .map(|command| command.trim_end_matches('`').to_string())
        .filter(|command| command.contains("rustc"))
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    for path in [&["--no-preload"][..], &[][..]] {
        check_cargo_build(&root, &rustc, &commands, path);
    }
}

/// `cargo build` in `root` traced, then each of its rustc `commands` alone, with
/// `path_args` (the path that records): rustc's allocations alike.
fn check_cargo_build(root: &Path, rustc: &Path, commands: &[String], path_args: &[&str]) {
    let fresh = || std::fs::remove_dir_all(root.join("target/debug")).unwrap();
    fresh();
    let run_in_root = |name: &str, command: &str| {
        let mut args = path_args.to_vec();
        args.extend([
            "alloc",
            "--mmap",
            "--no-svg",
            "--csv",
            "heap.csv",
            "--json",
            "heap.json",
            "-c",
        ]);
        args.push(command);
        let output = Command::new(common::binary())
            .args(&args)
            .current_dir(root)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env_remove("RUSTFLAGS")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let run_dir = Scratch::new(name);
        for file in ["heap.csv", "heap.json"] {
            std::fs::rename(root.join(file), run_dir.path(file)).unwrap();
        }
        let run = Run {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            svg: run_dir.path("none.svg"),
            folded_path: run_dir.path("none.folded"),
            scratch: run_dir,
        };
        eprintln!("cargo-trace -c {command}: {}", run.stderr);
        assert!(run.status.success(), "{}", run.stderr);
        run
    };
    let build = run_in_root("children-cargo-build", "cargo build");
    let mut in_build = allocations_of(&build, rustc);
    no_allocator_mapping_leaked(&build);

    // Its outputs are there: the dependency's rlib, which the second command reads.
    let mut direct = Vec::new();
    for (i, command) in commands.iter().enumerate() {
        // As cargo build ran it: no incremental state from an earlier compilation.
        let _ = std::fs::remove_dir_all(root.join("target/debug/incremental"));
        let run = run_in_root(&format!("children-cargo-rustc-{i}"), command);
        direct.extend(allocations_of(&run, rustc));
        no_allocator_mapping_leaked(&run);
    }
    direct.sort_unstable();
    in_build.sort_unstable();
    eprintln!(
        "rustc's allocations {path_args:?}: under cargo build {in_build:?}, run directly {direct:?}"
    );
    assert_eq!(in_build.len(), direct.len(), "{in_build:?} {direct:?}");
    for (built, alone) in in_build.iter().zip(&direct) {
        assert!(
            within_one_percent(*built, *alone),
            "under cargo build {in_build:?}, run directly {direct:?}"
        );
    }
}
