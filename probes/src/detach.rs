//! Detaching many links at once.
//!
//! Closing a tracepoint's perf event waits for RCU grace periods in the kernel
//! (`tracepoint_synchronize_unregister`): about 70 ms each here, so the 360
//! `syscalls:sys_enter_*` tracepoints took 26 s to detach one after the other.
//! Closed from several threads at once, the waits overlap.

use libbpf_rs::Link;

/// At most this many threads close links at once.
const MAX_THREADS: usize = 64;

/// Detaches `links` (drops them), from several threads when there are many.
pub fn detach(links: Vec<Link>) {
    if links.len() < 8 {
        drop(links);
        return;
    }
    let threads = links.len().min(MAX_THREADS);
    let mut shares: Vec<Vec<Link>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, link) in links.into_iter().enumerate() {
        shares[index % threads].push(link);
    }
    std::thread::scope(|scope| {
        for share in shares {
            // A thread that cannot start drops its share here, with its closure.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || drop(share));
        }
    });
}
