//! End to end: root never writes where another user points it, and bad arguments never
//! cost a run.
//!
//! The attacks run for real: an unprivileged user (created by the test, `useradd`)
//! plants directories, links and cache names where a root run of cargo-trace used to
//! write, cargo-trace runs as root (as if under sudo where the attack needs it), and the
//! victim, a root file, must be untouched afterwards.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use common::{binary, bpf_available, Scratch};

/// The unprivileged user the attacks run as.
const ATTACKER: &str = "cargo-trace-attacker";
const PRECIOUS: &str = "precious root data\n";

struct User {
    uid: u32,
    gid: u32,
    home: PathBuf,
}

/// The attacker, created on first use (it stays: creating users is slow and the next
/// run reuses it).
fn attacker() -> &'static User {
    static USER: OnceLock<User> = OnceLock::new();
    USER.get_or_init(|| {
        let lookup = || nix::unistd::User::from_name(ATTACKER).expect("reading the user database");
        if lookup().is_none() {
            let status = Command::new("useradd")
                .args([
                    "--create-home",
                    "--user-group",
                    "--shell",
                    "/usr/sbin/nologin",
                ])
                .arg(ATTACKER)
                .status()
                .expect("useradd (package passwd) must be installed: see .ci/setup.sh");
            // Another test binary may have created it meanwhile.
            assert!(
                status.success() || lookup().is_some(),
                "useradd {ATTACKER}: {status}"
            );
        }
        let user = lookup().expect("the attacker exists");
        User {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            home: user.dir,
        }
    })
}

/// Tests that run cargo-trace for the attacker (its home's cache) take turns.
fn attacker_home_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `script` with perl as the attacker (no supplementary groups: not root's).
fn as_attacker(script: &str, args: &[&str]) {
    let user = attacker();
    let output = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--clear-groups", "--", "perl", "-e", script])
        .args(args)
        .output()
        .expect("setpriv");
    assert!(
        output.status.success(),
        "as {ATTACKER}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory the attacker owns, inside `scratch` (which it may traverse).
fn attacker_dir(scratch: &Scratch, name: &str) -> PathBuf {
    let user = attacker();
    std::fs::set_permissions(scratch.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = scratch.path(name);
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid)).unwrap();
    dir
}

/// A root file the attacks aim at, in a directory of its own.
struct Victim {
    _scratch: Scratch,
    dir: PathBuf,
    file: PathBuf,
}

impl Victim {
    fn new() -> Victim {
        let scratch = Scratch::new("victim");
        std::fs::set_permissions(scratch.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = scratch.path("victim");
        std::fs::write(&file, PRECIOUS).unwrap();
        Victim {
            dir: scratch.dir().to_path_buf(),
            file,
            _scratch: scratch,
        }
    }

    fn assert_untouched(&self, context: &str) {
        let text = std::fs::read_to_string(&self.file).expect("the victim is still there");
        assert_eq!(text, PRECIOUS, "the victim was overwritten: {context}");
        let metadata = std::fs::metadata(&self.file).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (0, 0), "{context}");
        assert_eq!(listing(&self.dir), ["victim"], "{context}");
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// cargo-trace as root with a clean environment as to who invoked it.
fn cargo_trace(args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("SUDO_USER")
        .env_remove("XDG_CACHE_HOME")
        .stdin(Stdio::null());
    command
}

/// The same, as `sudo -E` would run it for the attacker (HOME kept).
fn cargo_trace_under_sudo(args: &[&str]) -> Command {
    let user = attacker();
    let mut command = cargo_trace(args);
    command
        .env("SUDO_UID", user.uid.to_string())
        .env("SUDO_GID", user.gid.to_string())
        .env("SUDO_USER", ATTACKER)
        .env("HOME", &user.home);
    command
}

fn run(mut command: Command, what: &str) -> Output {
    let output = command.output().expect("run cargo-trace");
    eprintln!(
        "{what}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim_end()
    );
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_one_line_error(status: ExitStatus, stderr: &str, mentions: &str) {
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {stderr}");
    assert!(lines[0].starts_with("cargo-trace: error: "), "{stderr}");
    assert!(lines[0].contains(mentions), "'{mentions}' not in: {stderr}");
}

/// The pids the kernel hands out next, `count` of them (wrapping at pid_max, where
/// numbering restarts above the first 300).
fn next_pids(count: u32) -> Vec<u32> {
    let read = |path: &str| -> u32 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let last = read("/proc/sys/kernel/ns_last_pid");
    let max = read("/proc/sys/kernel/pid_max");
    let mut pid = last;
    (0..count)
        .map(|_| {
            pid = if pid + 1 >= max { 300 } else { pid + 1 };
            pid
        })
        .collect()
}

/// Numbers as one argument, separated by spaces.
fn words(numbers: &[u32]) -> String {
    let words: Vec<String> = numbers.iter().map(u32::to_string).collect();
    words.join(" ")
}

#[test]
fn scratch_directories_planted_for_the_next_pids_are_never_used() {
    if !bpf_available("planted scratch directories") {
        return;
    }
    let victim = Victim::new();
    // The attack must be aimed right (cargo-trace's own pid among the planted ones); other
    // tests running at the same time take pids too, so a miss is tried again.
    for attempt in 1..=5 {
        let scratch = Scratch::new("planted-tmp");
        let tmp = attacker_dir(&scratch, "tmp");
        // What the attack of the issue planted: /tmp/cargo-trace-<pid> for the next pids,
        // each with vdso-<pid>.so links to the victim for the pids its target may get.
        let pids = next_pids(5000);
        let (first, last) = (pids[0], pids[pids.len() - 1]);
        as_attacker(
            r#"my ($dir, $victim, $pids) = @ARGV;
               for my $pid (split / /, $pids) {
                   mkdir "$dir/cargo-trace-$pid" or die "mkdir: $!";
                   for my $target ($pid + 1 .. $pid + 8) {
                       symlink $victim, "$dir/cargo-trace-$pid/vdso-$target.so" or die "ln: $!";
                   }
               }"#,
            &[
                &tmp.display().to_string(),
                &victim.file.display().to_string(),
                &words(&pids),
            ],
        );
        let planted = listing(&tmp);
        let out = Scratch::new("planted-tmp-out");
        let mut command = cargo_trace(&["profile:hz:99", "-c", "true"]);
        command
            .arg("-o")
            .arg(out.path("out.svg"))
            .env("TMPDIR", &tmp);
        let child = command.stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let output = child.wait_with_output().unwrap();
        eprintln!("cargo-trace was process {pid}: {}", stderr(&output));
        assert!(output.status.success(), "{}", stderr(&output));
        victim.assert_untouched("vDSO copy through a planted scratch directory");
        assert_eq!(
            listing(&tmp),
            planted,
            "cargo-trace changed {}",
            tmp.display()
        );
        if planted.contains(&format!("cargo-trace-{pid}")) {
            return;
        }
        eprintln!("attempt {attempt}: pid {pid} outside the planted range {first}..={last}");
    }
    panic!("cargo-trace's pid was never among the planted ones: the attack was not tried");
}

#[test]
fn killing_cargo_trace_leaves_nothing_in_the_temporary_directory() {
    if !bpf_available("SIGKILL leftovers") {
        return;
    }
    let tmp = Scratch::new("kill-tmp");
    let out = Scratch::new("kill-out");
    let mut child = cargo_trace(&["profile:hz:99", "-c", "sh -c 'echo $$; exec sleep 60'"])
        .arg("-o")
        .arg(out.path("out.svg"))
        .env("TMPDIR", tmp.dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The target runs once its tables are loaded and the probes attached.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let target: i32 = line.trim().parse().expect("the target's pid");
    child.kill().unwrap();
    child.wait().unwrap();
    // SAFETY: kill(2) of the target cargo-trace left running.
    unsafe { libc::kill(target, libc::SIGKILL) };
    assert_eq!(listing(tmp.dir()), Vec::<String>::new(), "left in TMPDIR");
    assert!(!Path::new(&format!("/tmp/cargo-trace-{}", child.id())).exists());
}

/// The unwind cache of the attacker's home.
fn attacker_cache() -> PathBuf {
    attacker().home.join(".cache/cargo-trace/unwind")
}

/// Every path from the attacker's `.cache` down, with its owner.
fn owners_under(dir: &Path) -> Vec<(PathBuf, u32, u32)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                pending.push(entry.unwrap().path());
            }
        }
        found.push((path, metadata.uid(), metadata.gid()));
    }
    found
}

#[test]
fn the_unwind_cache_under_sudo_is_the_users_and_planted_names_are_not_followed() {
    if !bpf_available("unwind cache under sudo") {
        return;
    }
    let _turn = attacker_home_lock();
    let user = attacker();
    let victim = Victim::new();
    let scratch = Scratch::new("cache-out");
    // Under sudo, outputs go where the user may write.
    let out = attacker_dir(&scratch, "out").join("out.svg");
    let dot_cache = user.home.join(".cache");
    let _ = std::fs::remove_dir_all(&dot_cache);
    let trace = |what: &str| {
        let mut command = cargo_trace_under_sudo(&["profile:hz:99", "-c", "true"]);
        command.arg("-o").arg(&out);
        let output = run(command, what);
        assert!(output.status.success(), "{what}: {}", stderr(&output));
        stderr(&output)
    };

    // A fresh home: the cache is created, and everything in it is the user's.
    trace("fresh cache");
    let entries: BTreeSet<String> = listing(&attacker_cache())
        .into_iter()
        .filter(|name| name.ends_with(".ctu"))
        .collect();
    assert!(
        entries.iter().any(|name| name.starts_with("b-")),
        "no entry by build-id in {entries:?}"
    );
    for (path, uid, gid) in owners_under(&dot_cache) {
        assert_eq!((uid, gid), (user.uid, user.gid), "{}", path.display());
    }
    assert_eq!(
        listing(&attacker_cache()).len(),
        entries.len(),
        "temporary files left"
    );

    // Links under every entry name and under the temporary names cargo-trace used to
    // give them (.NAME.PID.N.tmp) for the next pids.
    let pids = next_pids(400);
    let names: Vec<&str> = entries.iter().map(String::as_str).collect();
    as_attacker(
        r#"my ($dir, $victim, $names, $pids) = @ARGV;
           for my $name (split / /, $names) {
               unlink "$dir/$name";
               symlink $victim, "$dir/$name" or die "ln: $!";
               for my $pid (split / /, $pids) {
                   for my $n (0 .. 3) {
                       symlink $victim, "$dir/.$name.$pid.$n.tmp" or die "ln: $!";
                   }
               }
           }"#,
        &[
            &attacker_cache().display().to_string(),
            &victim.file.display().to_string(),
            &names.join(" "),
            &words(&pids),
        ],
    );
    trace("links under the cache's names");
    victim.assert_untouched("cache entries through planted links");
    for name in &entries {
        let metadata = std::fs::symlink_metadata(attacker_cache().join(name)).unwrap();
        assert!(metadata.is_file(), "{name} is still a link");
        assert_eq!((metadata.uid(), metadata.gid()), (user.uid, user.gid));
    }

    // The cache directory itself a link to a root directory: refused.
    as_attacker(
        r#"my ($dir, $target) = @ARGV;
           system("rm", "-rf", $dir) == 0 or die "rm";
           symlink $target, $dir or die "ln: $!";"#,
        &[
            &attacker_cache().display().to_string(),
            &victim.dir.display().to_string(),
        ],
    );
    let said = trace("the cache directory a link");
    assert!(said.contains("the unwind cache is not used"), "{said}");
    victim.assert_untouched("cache entries through a linked cache directory");
    let _ = std::fs::remove_dir_all(&dot_cache);

    // Root without sudo, with the user's HOME (su -p): nothing created in that home.
    let mut command = cargo_trace(&["profile:hz:99", "-c", "true"]);
    command.arg("-o").arg(&out).env("HOME", &user.home);
    let output = run(command, "root with the user's HOME");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("the unwind cache is not used"));
    assert!(
        !dot_cache.exists(),
        "root created {} in the user's home",
        dot_cache.display()
    );
}

#[test]
fn outputs_under_sudo_replace_planted_links_and_belong_to_the_user() {
    if !bpf_available("outputs under sudo") {
        return;
    }
    let _turn = attacker_home_lock();
    let user = attacker();
    let victim = Victim::new();
    let scratch = Scratch::new("sudo-outputs");
    let work = attacker_dir(&scratch, "work");
    as_attacker(
        r#"my ($dir, $victim) = @ARGV;
           symlink $victim, "$dir/flamegraph.svg" or die "ln: $!";
           symlink $victim, "$dir/out.folded" or die "ln: $!";"#,
        &[
            &work.display().to_string(),
            &victim.file.display().to_string(),
        ],
    );
    let mut command =
        cargo_trace_under_sudo(&["profile:hz:99", "-c", "true", "--folded", "out.folded"]);
    command.current_dir(&work);
    let output = run(command, "outputs under sudo");
    assert!(output.status.success(), "{}", stderr(&output));
    victim.assert_untouched("outputs through planted links");
    for name in ["flamegraph.svg", "out.folded"] {
        let metadata = std::fs::symlink_metadata(work.join(name)).unwrap();
        assert!(metadata.is_file(), "{name} is not a regular file");
        assert_eq!(
            (metadata.uid(), metadata.gid()),
            (user.uid, user.gid),
            "{name}"
        );
    }
    let svg = std::fs::read_to_string(work.join("flamegraph.svg")).unwrap();
    assert!(svg.starts_with("<?xml"));
    assert_eq!(listing(&work), ["flamegraph.svg", "out.folded"]);
}

#[test]
fn outputs_never_go_through_another_users_link_or_where_the_sudo_user_may_not_write() {
    if !bpf_available("output directories") {
        return;
    }
    let _turn = attacker_home_lock();
    let victim = Victim::new();
    let scratch = Scratch::new("output-dirs");
    let work = attacker_dir(&scratch, "work");
    let marker = scratch.path("started");
    let command = format!("touch {}", common::quoted(&marker));
    // A directory of the attacker's with a link to the victim's directory in it.
    as_attacker(
        r#"my ($dir, $target) = @ARGV; symlink $target, "$dir/out" or die "ln: $!";"#,
        &[
            &work.display().to_string(),
            &victim.dir.display().to_string(),
        ],
    );
    let through_link = work.join("out/victim");
    let through_link = through_link.display().to_string();
    let output = run(
        cargo_trace(&["profile:hz:99", "-c", &command, "-o", &through_link]),
        "root, output through the attacker's link",
    );
    assert_one_line_error(output.status, &stderr(&output), "a link another user owns");
    // Under sudo, the same link is the user's own, but the directory it leads to is not
    // theirs to write; nor is the victim's directory named directly.
    let direct = victim.file.display().to_string();
    for path in [&through_link, &direct] {
        let output = run(
            cargo_trace_under_sudo(&["profile:hz:99", "-c", &command, "-o", path]),
            "sudo, output where the user may not write",
        );
        assert_one_line_error(output.status, &stderr(&output), "under sudo");
    }
    assert!(!marker.exists(), "the target ran");
    victim.assert_untouched("outputs in a directory the user may not write");
}

#[test]
fn bad_output_paths_fail_before_the_target_starts() {
    let scratch = Scratch::new("bad-outputs");
    let marker = scratch.path("started");
    let command = format!("touch {}", common::quoted(&marker));
    let directory = scratch.dir().display().to_string();
    let same = scratch.path("same").display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["-o", "/nonexistent/x.svg"], "/nonexistent"),
        (&["-o", "/proc/x.svg"], "/proc/x.svg"),
        (&["-o", &directory], "directory"),
        (&["-o", "/dev/full"], "/dev/full"),
        (&["--folded", "/dev/full"], "/dev/full"),
        (&["--folded", "/nonexistent/x.folded"], "/nonexistent"),
        (&["-o", &same, "--folded", &same], "both"),
    ];
    for (extra, mentions) in cases {
        let mut args = vec!["profile:hz:99", "-c", &command];
        args.extend_from_slice(extra);
        let output = run(cargo_trace(&args), &format!("{extra:?}"));
        assert_one_line_error(output.status, &stderr(&output), mentions);
        assert!(!marker.exists(), "the target ran with {extra:?}");
    }
    assert_eq!(listing(scratch.dir()), Vec::<String>::new());
}

#[test]
fn a_failed_write_at_the_end_keeps_the_other_outputs_and_the_summary() {
    if !bpf_available("failed write") {
        return;
    }
    let scratch = Scratch::new("failed-write");
    let doomed = scratch.path("doomed");
    std::fs::create_dir(&doomed).unwrap();
    let folded = scratch.path("out.folded");
    // The target removes the flamegraph's directory, then exits with code 3.
    let command = format!("sh -c 'rmdir {}; exit 3'", common::quoted(&doomed));
    let mut cargo = cargo_trace(&["profile:hz:99", "-c", &command, "--folded"]);
    cargo.arg(&folded).arg("-o").arg(doomed.join("out.svg"));
    let output = run(cargo, "failed write");
    let stderr = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(" events, "), "no summary: {stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("cargo-trace: error: ")
            && last.contains("flamegraph")
            && last.contains("exited with code 3"),
        "{stderr}"
    );
    assert!(folded.is_file(), "the folded stacks were not written");
    assert!(stderr.contains("wrote") && stderr.contains("out.folded"));
}

#[test]
fn argument_errors_are_one_line_and_start_nothing() {
    let scratch = Scratch::new("arguments");
    let marker = scratch.path("started");
    let command = format!("touch {}", common::quoted(&marker));
    let cases: &[(&[&str], &str)] = &[
        (&["-d", "1e20"], "1e20"),
        (&["-d", "1e19"], "1e19"),
        (&["-d", "-1"], "-1"),
    ];
    for (extra, mentions) in cases {
        let mut args = vec!["profile:hz:99", "-c", &command];
        args.extend_from_slice(extra);
        let output = run(cargo_trace(&args), &format!("{extra:?}"));
        assert_one_line_error(output.status, &stderr(&output), mentions);
        assert!(!marker.exists(), "the target ran with {extra:?}");
    }
    let huge = "99999999999999999999";
    let output = run(cargo_trace(&["profile:hz:99", "-p", huge]), "huge pid");
    assert_one_line_error(output.status, &stderr(&output), huge);

    // A zombie: a child its parent never reaps.
    let mut parent = Command::new("perl")
        .args([
            "-e",
            "$| = 1; my $pid = fork; if ($pid) { print \"$pid\\n\"; sleep 60 } else { exit 0 }",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let zombie = line.trim().to_string();
    while cargo_trace_tests::process::process_state(zombie.parse().unwrap()) != Some('Z') {
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = run(cargo_trace(&["profile:hz:99", "-p", &zombie]), "zombie pid");
    parent.kill().unwrap();
    parent.wait().unwrap();
    assert_one_line_error(output.status, &stderr(&output), "zombie");
}

#[test]
fn an_unprivileged_run_prints_one_line_unless_verbose() {
    let scratch = Scratch::new("unprivileged");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dir = if root {
        attacker_dir(&scratch, "out")
    } else {
        scratch.dir().to_path_buf()
    };
    let svg = dir.join("out.svg").display().to_string();
    let unprivileged = |extra: &[&str]| {
        let args = ["uprobe:libc:malloc", "-c", "true", "-o", &svg];
        let mut command = if root {
            let user = attacker();
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={}", user.uid))
                .arg(format!("--regid={}", user.gid))
                .args(["--clear-groups", "--", binary()]);
            command
        } else {
            Command::new(binary())
        };
        command.args(args).args(extra).current_dir(&dir);
        run(command, &format!("unprivileged {extra:?}"))
    };
    let quiet = unprivileged(&[]);
    assert_one_line_error(quiet.status, &stderr(&quiet), "needs root");
    let verbose = unprivileged(&["--verbose"]);
    let text = stderr(&verbose);
    assert_eq!(verbose.status.code(), Some(2), "{text}");
    assert!(
        text.lines().count() > 1 && text.contains("libbpf"),
        "--verbose shows libbpf's lines: {text}"
    );
}

/// Waits until cargo-trace (`pid`) holds perf events, i.e. has attached its probes.
fn wait_for_probes(pid: u32) {
    loop {
        let attached = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| {
                fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                    .any(|target| target.to_string_lossy().contains("perf_event"))
            })
            .unwrap_or(false);
        if attached {
            // The other CPUs' events follow within the same loop.
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_attached_process_that_exits_is_reported() {
    if !bpf_available("attached exit") {
        return;
    }
    let out = Scratch::new("attached-exit");
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = target.id().to_string();
    let child = cargo_trace(&["profile:hz:99", "-p", &pid])
        .arg("-o")
        .arg(out.path("out.svg"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_probes(child.id());
    target.kill().unwrap();
    target.wait().unwrap();
    let output = child.wait_with_output().unwrap();
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(&format!("cargo-trace: process {pid} exited")),
        "{text}"
    );
    assert!(out.path("out.svg").is_file());
}

/// Starts cargo-trace on a shell command that prints its pid first; returns it with
/// the target's pid (the target prints only once the probes are live).
fn start_with_target(command: &str, out: &Scratch) -> (Child, i32) {
    let mut child = cargo_trace(&["profile:hz:99", "-c", command])
        .arg("-o")
        .arg(out.path("out.svg"))
        .arg("--folded")
        .arg(out.path("out.folded"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().expect("the target's pid"))
}

fn alive(pid: i32) -> bool {
    cargo_trace_tests::process::process_state(pid as u32).is_some_and(|state| state != 'Z')
}

#[test]
fn sighup_ends_the_session_like_sigterm() {
    if !bpf_available("SIGHUP") {
        return;
    }
    let out = Scratch::new("sighup");
    let (child, target) = start_with_target("sh -c 'echo $$; exec sleep 60'", &out);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let output = child.wait_with_output().unwrap();
    // The target got the hang-up too: 128 + SIGHUP.
    assert_eq!(output.status.code(), Some(129), "{}", stderr(&output));
    assert!(!alive(target), "the target runs on");
    let svg = std::fs::read_to_string(out.path("out.svg")).expect("the flamegraph");
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(out.path("out.folded").is_file());
}

#[test]
fn a_target_that_ignores_ctrl_c_is_waited_for_with_a_word() {
    if !bpf_available("waiting notice") {
        return;
    }
    let out = Scratch::new("waiting");
    let (mut child, target) = start_with_target(
        r#"perl -e '$| = 1; $SIG{INT} = "IGNORE"; print "$$\n"; sleep 60'"#,
        &out,
    );
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert_ne!(stderr.read_line(&mut line).unwrap(), 0, "ended: {seen}");
        seen.push_str(&line);
        if line.contains(&format!("waiting for process {target} to exit"))
            && line.contains("a second Ctrl-C kills it")
        {
            break;
        }
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    stderr.read_to_string(&mut seen).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(137), "{seen}");
    assert!(!alive(target));
}

#[test]
fn a_daemon_left_running_by_the_target_is_named() {
    if !bpf_available("daemon") {
        return;
    }
    let out = Scratch::new("daemon");
    let (child, daemon) = start_with_target("sh -c 'sleep 60 >/dev/null 2>&1 & echo $!'", &out);
    let output = child.wait_with_output().unwrap();
    let text = stderr(&output);
    let running = alive(daemon);
    // SAFETY: kill(2) of the daemon the test's target started.
    unsafe { libc::kill(daemon, libc::SIGKILL) };
    assert!(output.status.success(), "{text}");
    assert!(running, "the daemon {daemon} did not outlive the session");
    let svg = std::fs::read_to_string(out.path("out.svg")).expect("the flamegraph");
    assert!(svg.trim_end().ends_with("</svg>"), "{text}");
    assert!(out.path("out.folded").is_file(), "{text}");
    assert!(
        text.contains(&format!("process {daemon} still running, untraced")),
        "{text}"
    );
}

/// Under sudo, `cargo trace` builds the crate as the user who ran sudo: the build's
/// `target/` is theirs, not root's (cargo-flamegraph's oldest complaint). The user here
/// has no toolchain of their own, so their "cargo" is a stand-in that records who ran it,
/// makes `target/` and replays the artifact message of a real build made beforehand.
#[test]
fn under_sudo_the_crate_is_built_as_the_user() {
    if !bpf_available("sudo build") {
        return;
    }
    let _home = attacker_home_lock();
    let user = attacker();
    // The crate, in a directory of the user's.
    let place = tempfile::tempdir().unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let krate = place.path().join("crate");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"sudo-built\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        krate.join("src/main.rs"),
        "fn main() { println!(\"built\"); }\n",
    )
    .unwrap();
    for path in [&krate, &krate.join("src")] {
        std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    }
    // A real build of it (as root, elsewhere), for its artifact message and executable.
    let real = tempfile::tempdir().unwrap();
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args([
            "build",
            "--release",
            "--message-format=json",
            "--manifest-path",
        ])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", real.path())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "the real build failed");
    let artifact = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .find(|line| line.contains("\"compiler-artifact\"") && line.contains("\"executable\":\"/"))
        .expect("an artifact with an executable")
        .to_string();
    // The user's stand-in cargo, where they can run it.
    let tools = place.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let record = tools.join("built-by");
    std::fs::write(tools.join("artifact.json"), format!("{artifact}\n")).unwrap();
    let cargo = tools.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\nid -u > {record}.tmp\nmkdir -p target/release\ncat {artifact}\n",
            record = record.display(),
            artifact = tools.join("artifact.json").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&tools, std::fs::Permissions::from_mode(0o777)).unwrap();

    let svg = krate.join("flamegraph.svg");
    let mut command = cargo_trace_under_sudo(&[
        "profile:hz:99",
        "--manifest-path",
        krate.join("Cargo.toml").to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    command.env("CARGO", &cargo).current_dir(&krate);
    let output = run(command, "cargo trace under sudo");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("built"));
    let built_by = std::fs::read_to_string(format!("{}.tmp", record.display())).unwrap();
    assert_eq!(built_by.trim(), user.uid.to_string(), "cargo ran as root");
    let target = std::fs::metadata(krate.join("target")).unwrap();
    assert_eq!((target.uid(), target.gid()), (user.uid, user.gid));
    let svg = std::fs::metadata(&svg).unwrap();
    assert_eq!(svg.uid(), user.uid, "the flamegraph is root's");
}

/// The attack on the heap profiler's preloaded library: root runs `cargo trace alloc`
/// with `TMPDIR` in a directory an unprivileged user owns; for the whole run that user
/// renames away whatever cargo-trace makes there or under `/run/cargo-trace` and puts a
/// library of its own (whose constructor marks that it ran) in its place, under the
/// library's name. The target's `ls` must run, and the planted library never.
#[test]
fn a_planted_preload_library_never_runs() {
    if !bpf_available("a planted preload library") {
        return;
    }
    let scratch = Scratch::new("planted-preload");
    let tmp = attacker_dir(&scratch, "tmp");
    let marker = scratch.path("the-planted-library-ran");
    // The attacker's library, built by the test: its constructor writes the marker.
    let source = scratch.path("planted.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void)\n\
             {{ FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let planted = scratch.path("libcargo-trace-preload.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&planted)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success(), "building the planted library");
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    // For 4 s: every directory the attacker can see made by cargo-trace, in its TMPDIR
    // or under /run/cargo-trace, is renamed away and replaced by one holding the planted
    // library under every name the real one could have.
    let attack = r#"
        my ($tmp, $planted) = @ARGV;
        my $end = time + 4;
        my %replaced;
        while (time < $end) {
            for my $dir (glob("$tmp/*"), glob("/run/cargo-trace/*")) {
                next if $dir =~ /\.moved$/ || $replaced{$dir};
                rename($dir, "$dir.moved") or next;
                mkdir($dir) or next;
                $replaced{$dir} = 1;
                system("cp", $planted, "$dir/libcargo-trace-preload.so");
            }
            select(undef, undef, undef, 0.01);
        }
    "#;
    let planted_path = planted.display().to_string();
    let tmp_path = tmp.display().to_string();
    let attacker_thread = std::thread::spawn(move || {
        as_attacker(attack, &[&tmp_path, &planted_path]);
    });
    let mut command = cargo_trace(&["alloc", "-c", "sh -c 'sleep 2; ls /'", "--no-svg", "-q"]);
    command.env("TMPDIR", &tmp);
    let output = run(command, "alloc under an attacker's TMPDIR");
    attacker_thread.join().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        listed.lines().any(|line| line == "usr"),
        "ls did not run: {listed}"
    );
    assert!(!marker.exists(), "the planted library ran as root");
    // cargo-trace made nothing in the attacker's directory.
    let left: Vec<String> = listing(&tmp)
        .into_iter()
        .filter(|name| !name.ends_with(".moved"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "made in TMPDIR");
}
