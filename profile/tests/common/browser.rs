//! Opening a report in real browsers, headless: Chromium (print to PDF and read the
//! text it drew with poppler's `pdftotext`; the DOM its script built) and Firefox (a
//! page served from a local socket loads the report in a frame, reads what it drew
//! and posts it back). `.ci/setup.sh` installs Chromium and poppler-utils, so under CI
//! their absence is a failure; Firefox is checked where it is installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The first of `names` that runs, if any.
fn found(names: &[&'static str]) -> Option<&'static str> {
    names.iter().copied().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// Whether a check can run: `tool` is missing outside CI says so and skips; under CI
/// it fails.
fn required(tool: Option<&'static str>, what: &str) -> Option<&'static str> {
    if tool.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} is missing: .ci/setup.sh installs it"
        );
        eprintln!("skipping the {what} checks: not installed (bash .ci/setup.sh installs it)");
    }
    tool
}

/// Headless, without the sandbox (as root, chromium refuses to start inside it), and
/// without its own connections (this machine refuses them).
const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Headless Chromium, and `pdftotext` to read what it prints.
pub struct Chromium {
    binary: &'static str,
}

impl Chromium {
    pub fn find() -> Option<Chromium> {
        let binary = required(
            found(&["chromium", "chromium-browser", "google-chrome"]),
            "chromium",
        )?;
        required(pdftotext(), "pdftotext (poppler-utils)")?;
        Some(Chromium { binary })
    }

    /// Runs it on `page` with `args`, in a profile of its own, without the network
    /// (this machine refuses its background connections, and a report asks none).
    pub fn run(&self, page: &Path, args: &[&str]) -> (Output, Duration) {
        let profile = tempfile::tempdir().expect("a profile directory");
        let started = Instant::now();
        let output = Command::new(self.binary)
            .args(CHROMIUM_FLAGS)
            // Any host name fails at once: a page that reached for the network would
            // log the failure.
            .arg("--host-resolver-rules=MAP * ~NOTFOUND")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(args)
            .arg(format!("file://{}", page.display()))
            .stdin(Stdio::null())
            .output()
            .expect("run chromium");
        let took = started.elapsed();
        assert!(
            output.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        (output, took)
    }

    /// Prints `page` to `pdf`: how long Chromium took.
    pub fn print(&self, page: &Path, pdf: &Path) -> Duration {
        let (_, took) = self.run(
            page,
            &[
                &format!("--print-to-pdf={}", pdf.display()),
                "--no-pdf-header-footer",
            ],
        );
        took
    }

    /// The page printed to PDF, as text (`pdftotext`), and how long Chromium took.
    pub fn printed_text(&self, page: &Path) -> (String, Duration) {
        let directory = tempfile::tempdir().expect("a scratch directory");
        let pdf = directory.path().join("report.pdf");
        let took = self.print(page, &pdf);
        (pdf_text(&pdf), took)
    }

    /// The DOM as the page's script left it, and how long Chromium took.
    pub fn dom(&self, page: &Path) -> (String, Duration) {
        let (output, took) = self.run(page, &["--dump-dom"]);
        (String::from_utf8_lossy(&output.stdout).into_owned(), took)
    }
}

/// `pdftotext`, if it runs (`-v` prints its version; old poppler exits 99 after it).
fn pdftotext() -> Option<&'static str> {
    Command::new("pdftotext")
        .arg("-v")
        .output()
        .ok()
        .map(|_| "pdftotext")
}

/// The text of a PDF, as pdftotext reads it.
pub fn pdf_text(pdf: &Path) -> String {
    let output = Command::new("pdftotext")
        .arg(pdf)
        .arg("-")
        .output()
        .expect("run pdftotext");
    assert!(
        output.status.success(),
        "pdftotext failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The function the checking page searches for: a branch of the generated profiles.
pub const SEARCH: &str = "list_append";

/// What the checking page read from a report and did with it, as JSON.
pub type Reading = serde_json::Value;

/// Serves `report` and the checking page on 127.0.0.1, runs `open` on the checking
/// page's URL (a browser, headless), and returns what the page posted back.
fn check(report: &Path, open: impl FnOnce(&str) -> Output) -> (Reading, Duration) {
    let report = std::fs::read(report).expect("the report");
    let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = listener.local_addr().expect("its address").port();
    let (posted, reading) = mpsc::channel();
    std::thread::spawn(move || serve(listener, report, posted));
    let started = Instant::now();
    let output = open(&format!("http://127.0.0.1:{port}/check.html"));
    let took = started.elapsed();
    let posted = reading
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| {
            panic!(
                "the checking page posted nothing: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    (
        serde_json::from_str(&posted).expect("the checking page's JSON"),
        took,
    )
}

impl Chromium {
    /// The checking page's reading of `report` (see [`CHECKING_PAGE`]).
    pub fn check(&self, report: &Path) -> (Reading, Duration) {
        check(report, |url| {
            let profile = tempfile::tempdir().expect("a profile directory");
            Command::new(self.binary)
                .args(CHROMIUM_FLAGS)
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .arg("--window-size=1280,2000")
                .arg("--dump-dom")
                .arg(url)
                .stdin(Stdio::null())
                .output()
                .expect("run chromium")
        })
    }
}

/// Headless Firefox.
pub struct Firefox {
    binary: &'static str,
}

impl Firefox {
    /// Firefox where it is installed (.ci/setup.sh does not install it: Chromium is the
    /// browser CI checks; this one is checked where a person has it).
    pub fn find() -> Option<Firefox> {
        let binary = found(&["firefox-esr", "firefox"]);
        if binary.is_none() {
            eprintln!(
                "skipping the Firefox checks: firefox is not installed (apt-get install firefox-esr)"
            );
        }
        binary.map(|binary| Firefox { binary })
    }

    /// The checking page's reading of `report` (see [`CHECKING_PAGE`]).
    pub fn check(&self, report: &Path) -> (Reading, Duration) {
        check(report, |url| {
            let scratch = tempfile::tempdir().expect("a scratch directory");
            let profile = scratch.path().join("profile");
            std::fs::create_dir(&profile).expect("a profile directory");
            // Nothing of its own on the network: no update, telemetry or safe-browsing
            // lists (this machine refuses them, and waiting on them stalls the run).
            std::fs::write(profile.join("user.js"), FIREFOX_PREFERENCES).expect("user.js");
            let screenshot: PathBuf = scratch.path().join("report.png");
            // It takes its screenshot once the page has loaded (the checking page posts
            // from its load event, before), then exits; one that hangs is ended.
            let mut child = Command::new(self.binary)
                .args(["--headless", "--no-remote", "--profile"])
                .arg(&profile)
                .arg("--window-size=1280,2000")
                .arg("--screenshot")
                .arg(&screenshot)
                .arg(url)
                .env("HOME", scratch.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run firefox");
            let deadline = Instant::now() + Duration::from_secs(300);
            while child.try_wait().expect("wait for firefox").is_none() && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            child.wait_with_output().expect("firefox's output")
        })
    }
}

const FIREFOX_PREFERENCES: &str = r#"
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("datareporting.healthreport.uploadEnabled", false);
user_pref("toolkit.telemetry.enabled", false);
user_pref("app.update.enabled", false);
user_pref("app.update.auto", false);
user_pref("network.captive-portal-service.enabled", false);
user_pref("network.connectivity-service.enabled", false);
user_pref("browser.safebrowsing.malware.enabled", false);
user_pref("browser.safebrowsing.phishing.enabled", false);
user_pref("browser.safebrowsing.downloads.enabled", false);
user_pref("extensions.update.enabled", false);
user_pref("browser.startup.homepage_override.mstone", "ignore");
"#;

/// Loads the report in a frame and, once it has loaded, reads what it drew and uses it
/// as a person would: searches (Enter), clicks a flamegraph box, switches the value,
/// opens rows of the top-down and bottom-up tables, prints (`beforeprint`). Posts what
/// it read as JSON, synchronously, so that it is sent before a screenshot ends the
/// browser. `SEARCH` is a function's name to search for.
const CHECKING_PAGE: &str = r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"></head><body>
<iframe id="report" src="report.html" style="width:1260px;height:1900px"></iframe>
<script>
window.addEventListener('load', () => {
  const result = {};
  try {
    const frame = document.getElementById('report');
    const doc = frame.contentDocument, win = frame.contentWindow;
    const $ = id => doc.getElementById(id);
    const texts = selector => Array.from(doc.querySelectorAll(selector)).map(t => t.textContent);
    result.drawnMs = doc.body.dataset.drawnMs || null;
    result.flameBoxes = doc.querySelectorAll('#flame rect').length;
    result.flameText = texts('#flame text');
    result.failed = texts('.bad').filter(t => t.includes('could not be drawn'));
    result.views = {};
    for (const view of doc.querySelectorAll('.view')) result.views[view.id] = view.textContent;
    result.charts = doc.querySelectorAll('svg.chart').length;

    // Search, applied on Enter (a change event).
    const search = $('search');
    search.value = 'SEARCH';
    search.dispatchEvent(new win.Event('change'));
    result.search = {
      matches: $('matches').textContent,
      highlighted: doc.querySelectorAll('#flame rect.hit').length,
      functions: texts('#functions-view td.name'),
      leaks: $('leaks-view') ? $('leaks-view').textContent : null,
      topDown: texts('#top-down-view td.name').length,
    };
    search.value = '';
    search.dispatchEvent(new win.Event('change'));
    result.afterSearch = { highlighted: doc.querySelectorAll('#flame rect.hit').length, matches: $('matches').textContent };

    // A click on Py_BytesMain's box: zoomed, its callers and callees shown.
    const box = Array.from(doc.querySelectorAll('#flame text')).find(t => t.textContent === 'Py_BytesMain');
    const rect = box && box.previousElementSibling;
    if (rect) rect.dispatchEvent(new win.MouseEvent('click', { bubbles: true }));
    result.zoom = { details: $('details').textContent, neighbours: $('neighbours-view').textContent };

    // Another value: the flamegraph and tables follow it.
    const select = $('value');
    const other = Array.from(select.options).find(o => !o.disabled && !o.selected);
    if (other) {
      select.value = other.value;
      select.dispatchEvent(new win.Event('change'));
      result.switched = { to: other.textContent, details: $('details').textContent, functions: texts('#functions-view th').join(' | ') };
    }
    $('reset').dispatchEvent(new win.MouseEvent('click', { bubbles: true }));

    // The call tree opens on a click, and bottom-up shows callers.
    const before = doc.querySelectorAll('#top-down-view tr[data-n]').length;
    const rows = doc.querySelectorAll('#top-down-view tr[data-n]');
    rows[rows.length - 1].dispatchEvent(new win.MouseEvent('click', { bubbles: true }));
    result.topDown = { before, after: doc.querySelectorAll('#top-down-view tr[data-n]').length };
    const bottom = doc.querySelector('#bottom-up-view tr[data-r]');
    const beforeBottom = doc.querySelectorAll('#bottom-up-view tr[data-r]').length;
    bottom.dispatchEvent(new win.MouseEvent('click', { bubbles: true }));
    result.bottomUp = { before: beforeBottom, rows: texts('#bottom-up-view td.name').slice(0, 4) };

    // Printing draws every value's flamegraph.
    const printing = performance.now();
    win.dispatchEvent(new win.Event('beforeprint'));
    result.printMs = Math.round(performance.now() - printing);
    result.printed = Array.from(doc.querySelectorAll('.flamegraph')).map(f => ({
      title: f.querySelector('h3').textContent,
      names: Array.from(f.querySelectorAll('text')).map(t => t.textContent),
    }));
  } catch (error) {
    result.error = String(error) + ' ' + (error.stack || '');
  }
  const post = new XMLHttpRequest();
  post.open('POST', 'result', false);
  post.send(JSON.stringify(result));
});
</script></body></html>
"#;

/// Serves the checking page and the report until the page posts its result.
fn serve(listener: TcpListener, report: Vec<u8>, posted: mpsc::Sender<String>) {
    let checking_page = CHECKING_PAGE.replace("SEARCH", SEARCH);
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
        let mut request = String::new();
        if reader.read_line(&mut request).is_err() {
            continue;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/");
        let (status, kind, body): (&str, &str, &[u8]) = match path {
            "/check.html" => ("200 OK", "text/html", checking_page.as_bytes()),
            "/report.html" => ("200 OK", "text/html; charset=utf-8", &report),
            "/result" => {
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let _ = posted.send(String::from_utf8_lossy(&body).into_owned());
                ("200 OK", "text/plain", b"ok")
            }
            _ => ("404 Not Found", "text/plain", b"not here"),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(body);
    }
}
