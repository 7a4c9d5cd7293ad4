//! What /proc says about a process: whether it still runs, for attaching to it and for
//! naming what a session leaves running.

use anyhow::{bail, Result};

use process_image::process_state as state;

/// Whether process `pid` exists and has not exited (a zombie has). A process whose
/// first thread exited while others run on (`pthread_exit` in `main`) shows that
/// thread's zombie state: it is alive while any of its threads is.
pub fn alive(pid: u32) -> bool {
    match state(pid) {
        None | Some('X') => false,
        Some('Z') => a_thread_runs(pid),
        Some(_) => true,
    }
}

fn a_thread_runs(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().any(|thread| {
        // A thread's /proc/TID/stat is its own, hidden from listings as it is.
        let tid = thread.file_name().to_str().and_then(|tid| tid.parse().ok());
        tid.and_then(state)
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// Refuses a pid that names no process, or one that has exited (a zombie its parent has
/// not reaped): there would be nothing to trace, and no end to the wait.
pub fn check_attachable(pid: u32) -> Result<()> {
    match state(pid) {
        None => bail!("no process {pid}"),
        Some(_) if !alive(pid) => {
            bail!("process {pid} has exited (a zombie its parent has not reaped): nothing to trace")
        }
        Some(_) => Ok(()),
    }
}

/// Of the `traced` processes, those other than `target` still running, sorted: when the
/// session ends (a daemon the target left behind), they run on untraced.
pub fn still_running(traced: Vec<u32>, target: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = traced
        .into_iter()
        .filter(|&pid| pid != target && alive(pid))
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_of_live_exited_and_missing_processes() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Unreaped, it is a zombie once it has exited.
        while state(pid) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(pid));
        let error = check_attachable(pid).unwrap_err().to_string();
        assert!(error.contains("zombie"), "{error}");
        assert_eq!(
            still_running(vec![pid, std::process::id()], 1),
            [std::process::id()]
        );
        child.wait().unwrap();
        assert_eq!(state(pid), None);
        assert!(check_attachable(pid)
            .unwrap_err()
            .to_string()
            .contains("no process"));
    }

    #[test]
    fn a_process_whose_first_thread_exited_is_alive_while_another_runs() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("leader_exits.c");
        let program = dir.path().join("leader_exits");
        std::fs::write(
            &source,
            "#include <pthread.h>\n#include <unistd.h>\n\
             static void *run(void *arg) { (void)arg; sleep(2); return 0; }\n\
             int main(void) { pthread_t t; pthread_create(&t, 0, run, 0); pthread_exit(0); }\n",
        )
        .unwrap();
        let built = std::process::Command::new("cc")
            .arg("-pthread")
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .status()
            .unwrap();
        assert!(built.success());
        let mut child = std::process::Command::new(&program).spawn().unwrap();
        let pid = child.id();
        while state(pid) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Its first thread is a zombie, its second sleeps.
        assert!(alive(pid));
        assert_eq!(still_running(vec![pid], 1), [pid]);
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
