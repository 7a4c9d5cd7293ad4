//! What the fixtures do, as data: their malloc sites, the call chain above
//! each, and a parser for the counts they print.
//!
//! The chains are the fixtures' own functions only, innermost first, as the
//! functions are named by their ELF symbols (Rust names demangled without the
//! hash). Above the outermost one comes the runtime's entry:
//! - [`Root::Process`]: (Rust: `std` frames of `lang_start`, then the C `main`
//!   rustc generates,) then libc's `__libc_start_call_main`,
//!   `__libc_start_main` (`__libc_start_main_impl`), and `_start` in the
//!   executable, whose CFI marks the end of the stack;
//! - [`Root::Thread`]: (Rust: `std::thread` frames, then
//!   `std::sys::pal::unix::thread::Thread::new::thread_start`,) then libc's
//!   `start_thread` and `clone3` (`__clone3`), the end of the stack.

use crate::fixtures::Lang;

/// How many frames of `recurse` stand between `beta` and `deep_leaf`.
pub const RECURSION_DEPTH: usize = 64;

/// What lies above a chain's outermost fixture function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// The process's main thread: `main`, libc's start, `_start`.
    Process,
    /// A thread created by the fixture: libc's `start_thread`, `clone3`.
    Thread,
}

/// One malloc site of the `chains` / `chains_c` fixtures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The function that calls malloc, as symbolized (`chains::deep_leaf`, `deep_leaf`).
    pub function: String,
    pub calls: u64,
    /// Bytes per call.
    pub size: u64,
    /// The site never frees its blocks.
    pub leaks: bool,
    /// The fixture's functions from the site out to the thread's or process's
    /// main function, innermost first (`chain[0] == function`).
    pub chain: Vec<String>,
    pub root: Root,
}

/// The sites of `chains` (Rust) or `chains_c` (C), in the order they print them.
pub fn chains_sites(lang: Lang) -> Vec<Site> {
    let name = |f: &str| match lang {
        Lang::Rust => format!("chains::{f}"),
        Lang::C | Lang::Cpp => f.to_string(),
    };
    let chain = |inner: &[&str], outer: &[&str]| -> Vec<String> {
        let mut chain: Vec<String> = inner.iter().map(|f| name(f)).collect();
        chain.extend(outer.iter().map(|f| name(f)));
        chain
    };
    let mut deep = vec!["deep_leaf"];
    deep.extend(std::iter::repeat_n("recurse", RECURSION_DEPTH));
    let site = |function: &str, calls, size, leaks, chain, root| Site {
        function: name(function),
        calls,
        size,
        leaks,
        chain,
        root,
    };
    vec![
        site(
            "deep_leaf",
            1000,
            64,
            false,
            chain(&deep, &["beta", "alpha", "main"]),
            Root::Process,
        ),
        site(
            "side_leaf",
            300,
            128,
            true,
            chain(&["side_leaf"], &["alpha", "main"]),
            Root::Process,
        ),
        site(
            "delta",
            200,
            256,
            false,
            chain(&["delta"], &["main"]),
            Root::Process,
        ),
        site(
            "worker_leaf",
            500,
            512,
            false,
            chain(&["worker_leaf"], &["worker_mid", "worker_main"]),
            Root::Thread,
        ),
    ]
}

/// The fixture functions of the main thread's stack when `chains stop` (or
/// `chains_c stop`) stops itself: libc's `raise` frames come first, then these.
pub fn stopped_main_chain(lang: Lang) -> Vec<String> {
    chains_sites(lang).swap_remove(0).chain
}

/// The worker thread's fixture functions while it blocks in libc's `read`
/// during a stop: libc's `read` comes first, then these.
pub fn stopped_worker_chain(lang: Lang) -> Vec<String> {
    chains_sites(lang).swap_remove(3).chain
}

/// The signal handler of `chains signal` / `chains_c signal`.
pub fn signal_handler(lang: Lang) -> String {
    match lang {
        Lang::Rust => "chains::on_sigusr1".to_string(),
        Lang::C | Lang::Cpp => "on_sigusr1".to_string(),
    }
}

/// One `site <function> calls <n> bytes <total> leaked <bytes>` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteCount {
    pub function: String,
    pub calls: u64,
    pub bytes: u64,
    pub leaked: u64,
}

/// The `site ...` lines of a fixture's stdout (`chains`, `chains_c`, `storm`).
/// Other lines are ignored; a malformed `site` line is an error.
pub fn parse_site_counts(stdout: &str) -> Result<Vec<SiteCount>, String> {
    stdout
        .lines()
        .filter(|line| line.starts_with("site "))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |index: usize, key: &str| -> Result<u64, String> {
                match (fields.get(index - 1), fields.get(index)) {
                    (Some(k), Some(v)) if *k == key => {
                        v.parse().map_err(|_| format!("bad {key} in {line:?}"))
                    }
                    _ => Err(format!("no {key} in {line:?}")),
                }
            };
            if fields.len() != 8 {
                return Err(format!("malformed site line {line:?}"));
            }
            Ok(SiteCount {
                function: fields[1].to_string(),
                calls: number(3, "calls")?,
                bytes: number(5, "bytes")?,
                leaked: number(7, "leaked")?,
            })
        })
        .collect()
}

/// `time hot <s> cold <s>` from `cpu_split`: the seconds of CPU time it measured in each.
pub fn parse_cpu_split(stdout: &str) -> Result<(f64, f64), String> {
    let line = stdout
        .lines()
        .find(|line| line.starts_with("time "))
        .ok_or("no `time` line")?;
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["time", "hot", hot, "cold", cold] => Ok((
            hot.parse()
                .map_err(|_| format!("bad hot time in {line:?}"))?,
            cold.parse()
                .map_err(|_| format!("bad cold time in {line:?}"))?,
        )),
        _ => Err(format!("malformed time line {line:?}")),
    }
}

/// One `heap <function> allocs <n> bytes <b> frees <f> leaked <blocks> size <s>` line of
/// the heap fixtures (`alloc_sites`, `alloc_c`): what the site allocated, how many of its
/// blocks were freed (by whoever freed them) and left live at exit, and the size of each
/// of its blocks (0 when they differ).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapSite {
    pub function: String,
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub leaked: u64,
    pub size: u64,
}

impl HeapSite {
    /// The log2 bucket cargo-trace counts its blocks in (their size's bit length), if
    /// they all have one size.
    pub fn size_bucket(&self) -> Option<usize> {
        (self.size > 0).then(|| 64 - self.size.leading_zeros() as usize)
    }
}

/// The `heap ...` lines of a fixture's stdout; a malformed one is an error.
pub fn parse_heap_sites(stdout: &str) -> Result<Vec<HeapSite>, String> {
    stdout
        .lines()
        .filter(|line| line.starts_with("heap "))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 12 {
                return Err(format!("malformed heap line {line:?}"));
            }
            let number = |index: usize, key: &str| -> Result<u64, String> {
                if fields[index - 1] != key {
                    return Err(format!("no {key} in {line:?}"));
                }
                fields[index]
                    .parse()
                    .map_err(|_| format!("bad {key} in {line:?}"))
            };
            Ok(HeapSite {
                function: fields[1].to_string(),
                allocs: number(3, "allocs")?,
                bytes: number(5, "bytes")?,
                frees: number(7, "frees")?,
                leaked: number(9, "leaked")?,
                size: number(11, "size")?,
            })
        })
        .collect()
}

/// The seconds the `offcpu` fixture measured blocked in each of its functions, from its
/// `blocked sleep <s> pipe <s> mutex <s>` line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Blocked {
    pub sleep: f64,
    pub pipe: f64,
    pub mutex: f64,
}

/// Parses the `offcpu` fixture's line.
pub fn parse_offcpu(stdout: &str) -> Result<Blocked, String> {
    let line = stdout
        .lines()
        .find(|line| line.starts_with("blocked "))
        .ok_or("no `blocked` line")?;
    let seconds = |text: &str| {
        text.parse::<f64>()
            .map_err(|_| format!("bad time {text:?} in {line:?}"))
    };
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["blocked", "sleep", sleep, "pipe", pipe, "mutex", mutex] => Ok(Blocked {
            sleep: seconds(sleep)?,
            pipe: seconds(pipe)?,
            mutex: seconds(mutex)?,
        }),
        _ => Err(format!("malformed blocked line {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_site_lines() {
        let out = "hello\nsite chains::deep_leaf calls 1000 bytes 64000 leaked 0\nsite x calls 1 bytes 2 leaked 2\n";
        assert_eq!(
            parse_site_counts(out).unwrap(),
            vec![
                SiteCount {
                    function: "chains::deep_leaf".into(),
                    calls: 1000,
                    bytes: 64000,
                    leaked: 0
                },
                SiteCount {
                    function: "x".into(),
                    calls: 1,
                    bytes: 2,
                    leaked: 2
                },
            ]
        );
        assert!(parse_site_counts("site x calls 1 bytes 2").is_err());
        assert!(parse_site_counts("site x calls one bytes 2 leaked 0").is_err());
        assert!(parse_site_counts("site x calls 1 octets 2 leaked 0").is_err());
    }

    #[test]
    fn parses_heap_lines() {
        let out = "x\nheap a::b allocs 3 bytes 30 frees 2 leaked 1 size 10\n";
        let sites = parse_heap_sites(out).unwrap();
        assert_eq!(sites[0].function, "a::b");
        assert_eq!(
            (
                sites[0].allocs,
                sites[0].bytes,
                sites[0].frees,
                sites[0].leaked
            ),
            (3, 30, 2, 1)
        );
        assert_eq!(sites[0].size_bucket(), Some(4));
        assert!(parse_heap_sites("heap a allocs 3 bytes 30 frees 2 leaked 1").is_err());
        assert!(parse_heap_sites("heap a allocs x bytes 30 frees 2 leaked 1 size 1").is_err());
    }

    #[test]
    fn parses_cpu_split() {
        assert_eq!(
            parse_cpu_split("time hot 1.333993 cold 0.668543\n").unwrap(),
            (1.333993, 0.668543)
        );
        assert!(parse_cpu_split("time hot x cold 1").is_err());
        assert!(parse_cpu_split("").is_err());
    }

    #[test]
    fn chains_have_the_documented_shape() {
        let sites = chains_sites(Lang::Rust);
        assert_eq!(sites[0].chain.len(), 1 + RECURSION_DEPTH + 3);
        assert_eq!(sites[0].chain.first().unwrap(), "chains::deep_leaf");
        assert_eq!(sites[0].chain.last().unwrap(), "chains::main");
        assert_eq!(
            stopped_worker_chain(Lang::C),
            ["worker_leaf", "worker_mid", "worker_main"]
        );
        assert!(sites.iter().all(|s| s.chain[0] == s.function));
    }
}
