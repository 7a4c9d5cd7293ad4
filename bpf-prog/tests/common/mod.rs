//! Shared by the BPF tests and the benchmarks: loading the tracer (or saying
//! why it cannot be), building C fixtures, registering a live process's
//! mappings and tables, naming the functions of a stack, and summing up
//! measurements.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use bpf_prog::{Mapping, ObjectId, Options, Stack, TableId, Tracer, WalkEnd};
use cargo_trace_tests::process;
use object::{Object, ObjectSymbol, SymbolKind};

/// Loads the tracer, or prints why BPF is unavailable here and returns None.
/// Any other failure (a verifier rejection above all) panics with the log.
pub fn tracer_or_skip(test: &str, options: &Options) -> Option<Tracer> {
    match Tracer::load(options) {
        Ok(tracer) => Some(tracer),
        Err(error) if error.is_permission_denied() => {
            eprintln!("SKIPPED {test}: BPF is not available to this user ({error}); run as root");
            None
        }
        Err(error) => {
            if let Some(log) = error.verifier_log() {
                eprintln!("verifier log (tail):");
                let lines: Vec<&str> = log.lines().collect();
                for line in &lines[lines.len().saturating_sub(80)..] {
                    eprintln!("{line}");
                }
            }
            panic!("{test}: {error}");
        }
    }
}

/// A scratch directory under the target dir, emptied first.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Compiles `source` with `gcc -O2 -fomit-frame-pointer` (plus `flags`) into `dir/name`.
pub fn build_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let c_file = dir.join(format!("{name}.c"));
    fs::write(&c_file, source).expect("write fixture source");
    let binary = dir.join(name);
    let output = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
        .arg(&binary)
        .arg(&c_file)
        .args(flags)
        .output()
        .expect("run gcc (the tests need a C compiler)");
    assert!(
        output.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// A fixture process that has printed "ready" (so ld.so has mapped its
/// libraries and main runs) and waits for a byte on stdin to go on.
pub struct Target {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    pub fn spawn(binary: &Path, args: &[String]) -> Target {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn fixture");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read fixture output");
        assert_eq!(line.trim(), "ready", "fixture did not start");
        let stdin = child.stdin.take();
        Target {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the fixture run its loop and returns without waiting.
    pub fn start(mut self) -> Running {
        let mut stdin = self.stdin.take().expect("stdin");
        stdin.write_all(b"g").expect("start fixture");
        drop(stdin);
        Running(self)
    }

    /// Lets the fixture run its loop, waits for it to exit successfully and
    /// returns what it printed after "ready".
    pub fn run_to_end(mut self) -> String {
        let mut stdin = self.stdin.take().expect("stdin");
        stdin.write_all(b"g").expect("start fixture");
        drop(stdin);
        let mut output = String::new();
        self.stdout
            .read_to_string(&mut output)
            .expect("read fixture output");
        let status = self.child.wait().expect("wait for fixture");
        assert!(status.success(), "fixture failed: {status}");
        output
    }
}

/// A fixture that was told to go.
pub struct Running(Target);

impl Running {
    /// Whether the fixture has exited (successfully: it panics otherwise).
    pub fn exited(&mut self) -> bool {
        match self.0.child.try_wait().expect("wait for fixture") {
            Some(status) => {
                assert!(status.success(), "fixture failed: {status}");
                true
            }
            None => false,
        }
    }

    pub fn wait_for_exit(mut self) {
        let status = self.0.child.wait().expect("wait for fixture");
        assert!(status.success(), "fixture failed: {status}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One executable file mapping of a live process.
#[derive(Clone, Debug)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub path: PathBuf,
}

/// The executable file mappings of `pid`, with load biases from the ELF headers.
pub fn executable_mappings(pid: u32) -> Vec<MappedFile> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    process::parse_maps(&maps)
        .into_iter()
        .filter(|entry| entry.is_executable() && entry.name.starts_with('/'))
        .map(|entry| {
            let data = fs::read(&entry.name).expect("read mapped file");
            let elf = object::File::parse(&*data).expect("parse mapped ELF");
            let segments = process::load_segments(&elf);
            let bias = process::load_bias(&segments, entry.start, entry.offset)
                .expect("an executable segment covers the mapping");
            MappedFile {
                start: entry.start,
                end: entry.end,
                bias,
                path: PathBuf::from(entry.name),
            }
        })
        .collect()
}

/// Compiles the unwind table of every executable mapping of `pid` (except
/// those `skip` rejects), loads them and registers the mappings. Returns
/// the mappings registered.
pub fn register_process(
    tracer: &mut Tracer,
    pid: u32,
    skip: impl Fn(&MappedFile) -> bool,
) -> Vec<MappedFile> {
    register_process_with(tracer, &mut HashMap::new(), pid, skip)
}

/// [`register_process`], reusing the tables in `tables` (by path) and adding
/// the ones it loads.
pub fn register_process_with(
    tracer: &mut Tracer,
    tables: &mut HashMap<PathBuf, TableId>,
    pid: u32,
    skip: impl Fn(&MappedFile) -> bool,
) -> Vec<MappedFile> {
    register(tracer, tables, pid, skip, false).0
}

/// [`register_process_with`], each object with an id (its table's index + 1), so that
/// the frames in it are stored as its addresses; returns the mappings as registered too.
pub fn register_process_by_object(
    tracer: &mut Tracer,
    tables: &mut HashMap<PathBuf, TableId>,
    pid: u32,
    skip: impl Fn(&MappedFile) -> bool,
) -> (Vec<MappedFile>, Vec<Mapping>) {
    register(tracer, tables, pid, skip, true)
}

fn register(
    tracer: &mut Tracer,
    tables: &mut HashMap<PathBuf, TableId>,
    pid: u32,
    skip: impl Fn(&MappedFile) -> bool,
    by_object: bool,
) -> (Vec<MappedFile>, Vec<Mapping>) {
    let mut registered = Vec::new();
    let mut mappings = Vec::new();
    for file in executable_mappings(pid) {
        if skip(&file) {
            continue;
        }
        let table = match tables.get(&file.path) {
            Some(&id) => id,
            None => {
                let compiled = unwind_tables::compile_file(&file.path)
                    .unwrap_or_else(|e| panic!("compile tables of {}: {e}", file.path.display()));
                let id = tracer.add_table(&compiled.table).expect("add table");
                tables.insert(file.path.clone(), id);
                id
            }
        };
        mappings.push(Mapping {
            start: file.start,
            end: file.end,
            bias: file.bias,
            table: Some(table),
            object: by_object
                .then(|| ObjectId::new(table.index() + 1))
                .flatten(),
        });
        registered.push(file);
    }
    tracer.set_mappings(pid, &mappings).expect("set mappings");
    (registered, mappings)
}

/// Function symbols of ELF files, for naming the frames of a stack.
#[derive(Default)]
pub struct Symbols {
    by_path: HashMap<PathBuf, Vec<(u64, u64, String)>>,
}

impl Symbols {
    fn functions(&mut self, path: &Path) -> &[(u64, u64, String)] {
        self.by_path.entry(path.to_path_buf()).or_insert_with(|| {
            let data = fs::read(path).expect("read ELF");
            let elf = object::File::parse(&*data).expect("parse ELF");
            let mut functions: Vec<(u64, u64, String)> = elf
                .symbols()
                .chain(elf.dynamic_symbols())
                .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.address() != 0)
                .filter_map(|symbol| {
                    Some((
                        symbol.address(),
                        symbol.size(),
                        symbol.name().ok()?.to_string(),
                    ))
                })
                .collect();
            functions.sort();
            functions.dedup_by_key(|f| f.0);
            functions
        })
    }

    /// The function containing ELF address `addr` of `path` (by symtab/dynsym).
    pub fn name(&mut self, path: &Path, addr: u64) -> Option<String> {
        let functions = self.functions(path);
        let index = functions.partition_point(|f| f.0 <= addr).checked_sub(1)?;
        let (start, size, name) = &functions[index];
        (addr < start + size.max(&1)).then(|| name.clone())
    }

    /// Names the frames of a stack: frame 0 at its pc, the others at pc - 1
    /// (return addresses). Frames outside `mappings` are "?", frames of
    /// unnamed code are "<file>+0xOFF".
    pub fn frames(&mut self, mappings: &[MappedFile], pcs: &[u64]) -> Vec<String> {
        pcs.iter()
            .enumerate()
            .map(|(index, &pc)| {
                let lookup = if index == 0 { pc } else { pc - 1 };
                let Some(file) = mappings
                    .iter()
                    .find(|m| m.start <= lookup && lookup < m.end)
                else {
                    return "?".to_string();
                };
                let addr = lookup - file.bias;
                self.name(&file.path, addr).unwrap_or_else(|| {
                    let base = file.path.file_name().unwrap_or_default().to_string_lossy();
                    format!("{base}+{addr:#x}")
                })
            })
            .collect()
    }
}

/// `chain CALLS DEPTH [stop]`: `main` waits for a byte on stdin, then calls
/// `rec(DEPTH)` CALLS times; rec recurses down to 0, then c1 -> c2 -> c3 ->
/// leaf (rec(0) tail-calls c1). leaf makes a getppid syscall, or with a third
/// argument stops the process with raise(SIGSTOP). Frames hold locals
/// of different sizes so the CFA offsets differ. `noipa` keeps gcc from
/// inlining, cloning or merging them; the work after each call keeps the
/// calls from becoming tail calls.
pub const CHAIN_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <signal.h>
#include <sys/syscall.h>

#define KEEP __attribute__((noipa))

volatile int sink;
int stop_in_leaf;

KEEP int leaf(int x)
{
	if (stop_in_leaf)
		raise(SIGSTOP);
	else
		syscall(SYS_getppid);
	sink += x;
	return sink;
}

KEEP int c3(int x)
{
	volatile char pad[200];
	pad[x & 127] = (char)x;
	return leaf(x) + pad[x & 127];
}

KEEP int c2(int x)
{
	return c3(x + 1) * 2;
}

KEEP int c1(int x)
{
	volatile long big[40];
	big[x & 31] = x;
	return c2(x) + (int)big[x & 31];
}

KEEP int rec(int depth, int x)
{
	volatile char buf[32];
	buf[depth & 31] = (char)depth;
	if (depth == 0)
		return c1(x);
	return rec(depth - 1, x) + buf[depth & 31];
}

int main(int argc, char **argv)
{
	int calls = atoi(argv[1]);
	int depth = atoi(argv[2]);
	char go;

	stop_in_leaf = argc > 3;
	printf("ready\n");
	fflush(stdout);
	if (read(0, &go, 1) != 1)
		return 2;
	for (int i = 0; i < calls; i++)
		rec(depth, i);
	return 0;
}
"#;

/// The tests share the kernel's uprobe on one binary and the CPUs; running
/// them one at a time keeps their counts their own.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn chain_fixture() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    built
        .get_or_insert_with(|| build_c(&scratch_dir("walk-fixture"), "chain", CHAIN_C, &[]))
        .clone()
}

/// The names expected from `leaf`'s caller down to `main`.
pub fn chain_below(first: &str, depth: usize) -> Vec<String> {
    let chain = ["leaf", "c3", "c2", "c1"];
    let start = chain
        .iter()
        .position(|f| *f == first)
        .expect("known function");
    let mut names: Vec<String> = chain[start..].iter().map(|s| s.to_string()).collect();
    // rec(depth) .. rec(1); rec(0) tail-calls c1, so it has no frame of its own.
    names.extend(std::iter::repeat_n("rec".to_string(), depth));
    names.push("main".to_string());
    names
}

/// Checks a complete stack: the chain, then libc's start code, then `_start`.
pub fn assert_complete(
    stack: &Stack,
    mappings: &[MappedFile],
    expected: &[String],
    binary: &PathBuf,
) {
    let names = Symbols::default().frames(mappings, &stack.pcs);
    assert_eq!(
        stack.end,
        WalkEnd::Complete,
        "walk did not complete: {names:?}"
    );
    assert_eq!(&names[..expected.len()], expected, "frames: {names:?}");
    let rest = &stack.pcs[expected.len()..];
    let (last, between) = rest.split_last().expect("frames below main");
    // Between main and _start: __libc_start_call_main and __libc_start_main.
    assert_eq!(between.len(), 2, "libc start frames: {names:?}");
    for &pc in between {
        let file = mappings
            .iter()
            .find(|m| m.start < pc && pc <= m.end)
            .expect("mapped");
        assert!(
            file.path.to_string_lossy().contains("libc"),
            "{} is not libc: {names:?}",
            file.path.display()
        );
    }
    let outermost = mappings
        .iter()
        .find(|m| m.start < *last && *last <= m.end)
        .expect("mapped");
    assert_eq!(
        &outermost.path, binary,
        "outermost frame not in the program: {names:?}"
    );
    assert_eq!(
        names.last().map(String::as_str),
        Some("_start"),
        "{names:?}"
    );
}

/// Median and minimum of a set of measurements.
pub struct Figure {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Figure {
    pub fn of(mut values: Vec<f64>) -> Figure {
        values.sort_by(f64::total_cmp);
        Figure {
            median: values[values.len() / 2],
            min: values[0],
            max: values[values.len() - 1],
        }
    }
}

/// Attaches `program` at the entry (or with `retprobe`, the return) of `function` in the
/// file `binary`, for process `pid`, with `cookie` as the probe id.
pub fn attach_to_function(
    program: &libbpf_rs::ProgramMut<'_>,
    pid: u32,
    binary: &Path,
    function: &str,
    retprobe: bool,
    cookie: u64,
) -> libbpf_rs::Link {
    program
        .attach_uprobe_with_opts(
            pid as i32,
            binary,
            0,
            libbpf_rs::UprobeOpts {
                cookie,
                retprobe,
                func_name: Some(function.to_string()),
                ..libbpf_rs::UprobeOpts::default()
            },
        )
        .unwrap_or_else(|e| panic!("attach to {function}: {e}"))
}
