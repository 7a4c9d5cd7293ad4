//! The line that says what a run is doing while the target runs: elapsed time, events so
//! far, failed walks, traced processes. Drawn on stderr only when stderr is a terminal
//! and `-q` was not given; cleared before the closing lines are printed.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What the line shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub elapsed: Duration,
    /// Events with a stack walk, so far.
    pub events: u64,
    /// Of those, walks that did not reach the end of the stack.
    pub failed: u64,
    /// Processes traced now (the target and the children followed).
    pub processes: usize,
}

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A line on stderr, unless `quiet` or stderr is not a terminal (then nothing is
    /// drawn at all).
    pub fn start(quiet: bool) -> Progress {
        let target = if quiet {
            ProgressDrawTarget::hidden()
        } else {
            // indicatif draws nothing when stderr is not a terminal.
            ProgressDrawTarget::stderr_with_hz(5)
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} cargo-trace: {msg}").expect("a valid template"),
        );
        bar.set_message("starting");
        Progress { bar }
    }

    pub fn update(&self, status: Status) {
        self.bar.set_message(line(status));
        self.bar.tick();
    }

    /// Prints `text` on its own line above the progress line.
    pub fn say(&self, text: &str) {
        if self.bar.is_hidden() {
            eprintln!("{text}");
        } else {
            self.bar.suspend(|| eprintln!("{text}"));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// `tracing 3.2 s · 1234 events · 2 failed walks · 3 processes`
fn line(status: Status) -> String {
    let mut line = format!(
        "tracing {:.1} s · {} events",
        status.elapsed.as_secs_f64(),
        status.events
    );
    if status.failed > 0 {
        line.push_str(&format!(" · {} failed walks", status.failed));
    }
    if status.processes > 1 {
        line.push_str(&format!(" · {} processes", status.processes));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_what_matters() {
        let mut status = Status {
            elapsed: Duration::from_millis(3250),
            events: 1234,
            failed: 0,
            processes: 1,
        };
        assert_eq!(line(status), "tracing 3.2 s · 1234 events");
        status.failed = 2;
        status.processes = 3;
        assert_eq!(
            line(status),
            "tracing 3.2 s · 1234 events · 2 failed walks · 3 processes"
        );
    }
}
