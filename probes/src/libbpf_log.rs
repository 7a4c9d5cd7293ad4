//! libbpf's own log. libbpf prints to stderr by default, which puts a second line,
//! in libbpf's words, before every one-line error of ours (an unknown raw tracepoint:
//! `libbpf: prog '...': failed to attach to raw tracepoint '...': -ENOENT`). Errors
//! carry what the user needs; libbpf's lines are for `-v`.

use libbpf_rs::PrintLevel;

/// Routes libbpf's log for the whole process: nothing at `verbosity` 0, warnings and
/// information at 1, debug lines too at 2 and more; each line prefixed with
/// `cargo-trace: libbpf: `.
pub fn libbpf_log(verbosity: u8) {
    let level = match verbosity {
        0 => {
            libbpf_rs::set_print(None);
            return;
        }
        1 => PrintLevel::Info,
        _ => PrintLevel::Debug,
    };
    libbpf_rs::set_print(Some((level, print)));
}

fn print(_level: PrintLevel, message: String) {
    for line in message.lines().filter(|line| !line.trim().is_empty()) {
        let line = line.strip_prefix("libbpf: ").unwrap_or(line);
        eprintln!("cargo-trace: libbpf: {line}");
    }
}
