//! Runs a program under in-process recording through the crate's own `Server`, a
//! `PlainTables` and a `Recorder`, and symbolizes what it recorded with the tests crate's
//! ELF symbol reader.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cargo_trace_tests::symbols::Symbols;
use preload::{Frame, Options, PlainTables, Recorder, Server, Stack};

/// What a recorded run left.
pub struct Run {
    pub recorder: Recorder,
    pub tables: PlainTables,
    pub status: ExitStatus,
    pub stdout: String,
    pub pid: u32,
    /// Kept: the library's file (frames of its wrappers) lives in its directory.
    pub server: Server,
    symbols: HashMap<u32, Option<Symbols>>,
}

/// Runs `program args` recorded, to its end (and every process it made).
pub fn record(program: &Path, args: &[&str], options: Options) -> Run {
    record_with(Command::new(program).args(args), options, |_, _| {})
}

/// Runs `command` recorded; `during` is called at each turn of the loop with the child's
/// pid and the recorder (to kill it, or stop the server's side).
pub fn record_with(
    command: &mut Command,
    options: Options,
    mut during: impl FnMut(u32, &mut Recorder),
) -> Run {
    let mut server = Server::new().expect("starting the server");
    let mut recorder = Recorder::new(options);
    let mut tables = PlainTables::new();
    let mut child = command
        .envs(server.environment(None))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the program");
    let pid = child.id();
    let mut out = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut busy = false;
    let status = loop {
        let wait = if busy {
            Duration::ZERO
        } else {
            Duration::from_millis(2)
        };
        server
            .serve(&mut tables, &mut recorder, wait)
            .expect("serving");
        busy = recorder.poll() > 0;
        if busy {
            std::thread::sleep(Duration::from_micros(100));
        }
        during(pid, &mut recorder);
        if let Some(status) = child.try_wait().expect("waiting") {
            break status;
        }
        assert!(Instant::now() < deadline, "the program did not finish");
    };
    // its children may run on; every connection closes when they are done
    let drained = Instant::now() + Duration::from_secs(60);
    while server.connections() > 0 && Instant::now() < drained {
        server
            .serve(&mut tables, &mut recorder, Duration::from_millis(5))
            .expect("serving");
        recorder.poll();
    }
    server
        .serve(&mut tables, &mut recorder, Duration::ZERO)
        .expect("serving");
    recorder.poll();
    let stdout = reader.join().expect("reading stdout");
    Run {
        recorder,
        tables,
        status,
        stdout,
        pid,
        server,
        symbols: HashMap::new(),
    }
}

impl Run {
    /// The names of a frame's function (a return address looked up inside its call).
    pub fn names(&mut self, frame: Frame, first: bool) -> Vec<String> {
        let Frame::InObject { object, address } = frame else {
            return Vec::new();
        };
        let tables = &self.tables;
        let symbols = self.symbols.entry(object).or_insert_with(|| {
            let path: PathBuf = tables.object_path(object)?.to_path_buf();
            let data = std::fs::read(&path).ok()?;
            let file = object::File::parse(&*data).ok()?;
            Some(Symbols::from_elf(&file, Some(&path)))
        });
        let at = if first { address } else { address - 1 };
        symbols.as_ref().map(|s| s.names_at(at)).unwrap_or_default()
    }

    /// A stack as one name per frame (the first name, or `?`).
    pub fn chain(&mut self, stack: &Stack) -> Vec<String> {
        stack
            .frames
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                self.names(f, i == 0)
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| "?".to_string())
            })
            .collect()
    }

    /// Every stack of process `pid` whose chain contains `function`, with its stats.
    pub fn stacks_through(
        &mut self,
        pid: u32,
        function: &str,
    ) -> Vec<(Vec<String>, preload::AllocStats)> {
        let stats = self.recorder.stats();
        let mut out = Vec::new();
        for (p, id, s) in stats {
            if p != pid {
                continue;
            }
            let stack = self.recorder.stack_of(id).clone();
            let chain = self.chain(&stack);
            if chain.iter().any(|n| n == function) {
                out.push((chain, s));
            }
        }
        out
    }
}
