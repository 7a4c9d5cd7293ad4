//! Detaching many links (or any [`crate::Attachment`]) at once.
//!
//! Closing a tracepoint's perf event waits for RCU grace periods in the kernel
//! (`tracepoint_synchronize_unregister`, under a mutex): about 70 ms each here, so
//! the 360 `syscalls:sys_enter_*` tracepoints took 28 s to detach one after the
//! other. Closed from many threads at once, part of the waits overlap (~15 s).

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// At most this many threads close links at once.
const MAX_THREADS: usize = 64;

/// How long detaching may take before the caller is told it is slow.
const SLOW: Duration = Duration::from_secs(1);

/// Detaches `links` (drops them), from several threads when there are many. Calls
/// `slow` with the number of links if detaching them takes longer than a second, for
/// the user to know what the wait is.
pub fn detach<L: Send>(links: Vec<L>, slow: impl FnOnce(usize)) {
    let total = links.len();
    let threads = total.min(MAX_THREADS);
    if threads == 0 {
        return;
    }
    let mut shares: Vec<Vec<L>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, link) in links.into_iter().enumerate() {
        shares[index % threads].push(link);
    }
    let (done, finished) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        for share in shares {
            let done = done.clone();
            // A thread that cannot start drops its share (and its sender) here, with
            // its closure.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || {
                drop(share);
                drop(done);
            });
        }
        drop(done);
        // Every sender gone: every share dropped.
        if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(SLOW) {
            slow(total);
        }
    });
}

/// Detaches `links` without waiting for the kernel to release them: a process forked
/// for it holds a copy of every descriptor, ours close at once, and the release of each
/// (its grace periods: 20-100 ms a link here, one after the other) runs as that process
/// ends, after ours has gone on. It then deletes the tracefs uprobe events `removal`
/// names (control file, command), which cannot go while a perf event of theirs is
/// open. The links' programs can still run for that while: the caller makes sure they
/// stop nothing and that nothing needs what they count. Falls back to [`detach`] if the
/// fork fails.
pub fn detach_in_background<L: Send>(links: Vec<L>, removal: Option<(&Path, &str)>) {
    if links.is_empty() {
        return;
    }
    match crate::sys::spawn_holder(removal) {
        Ok(release) => {
            crate::bound::defer_removal();
            drop(links);
            drop(release);
        }
        Err(_) => detach(links, |_| {}),
    }
}
