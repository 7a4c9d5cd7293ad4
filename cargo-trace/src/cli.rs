//! Command line: bpftrace's probe grammar and `-c`/`-p`, cargo-flamegraph's cargo flags.
//!
//! Cargo runs a subcommand as `cargo-trace trace ARGS`; run directly it is
//! `cargo-trace ARGS`; `main` drops the first word and [`Cli::from_args`] parses the rest.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use profile::heap::{Metric, OrderBy};
use profile::writers::heaptrack::Compression;
use profile::writers::Format;

use crate::cargo::CargoBuild;
use crate::settings::{Capacities, HeapSettings, OutputPlan, Settings, TargetSpec};

/// Trace a program with eBPF probes, unwinding user stacks in the kernel, and write a flamegraph.
#[derive(Debug, Parser)]
#[command(
    name = "cargo-trace",
    bin_name = "cargo trace",
    version,
    after_help = "EXAMPLES:\n  \
        cargo trace                                    build the crate's binary, profile it at 99 Hz, flamegraph.svg\n  \
        cargo trace profile:hz:99 --bin server -- --port 8080\n  \
        cargo trace uprobe:libc:malloc -c './prog arg'\n  \
        cargo trace uprobe:libc:malloc -p 1234         attach to a running process\n  \
        cargo trace tracepoint:sched:sched_switch -c ./prog\n  \
        cargo trace alloc -c ./prog                    heap profile: allocations, frees, leaks, peak\n  \
        cargo trace alloc:jemalloc --metric leaked-bytes -c ./prog\n  \
        cargo trace alloc --heaptrack heaptrack.prog.zst -c ./prog   for heaptrack_gui / heaptrack_print\n  \
        cargo trace diff before.folded after.folded    differential flamegraph, diff.svg"
)]
pub struct Cli {
    /// Probes in bpftrace's grammar, e.g. profile:hz:99, uprobe:libc:malloc,
    /// uretprobe:./prog:myprog::parse, tracepoint:sched:sched_switch; or alloc[:ALLOCATOR]
    /// (libc, jemalloc, mimalloc, a library's path) to profile the heap
    /// [default: profile:hz:99].
    #[arg(value_name = "PROBE")]
    pub probes: Vec<String>,

    /// Run this command (split like a shell would, without running a shell) and trace it.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "CMD",
        conflicts_with = "pid"
    )]
    pub command: Option<String>,

    /// Attach to this running process instead of starting one. With a non-numeric value,
    /// `-p` is cargo's `--package`.
    #[arg(long = "pid", value_name = "PID")]
    pub pid: Option<u32>,

    /// Stop tracing after this many seconds (a launched target then runs on untraced).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    /// Trace only the target process, not the processes it starts.
    #[arg(long = "no-follow-forks")]
    pub no_follow_forks: bool,

    /// Where to write the flamegraph (SVG).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "PATH",
        default_value = "flamegraph.svg"
    )]
    pub output: PathBuf,

    /// Also write folded stacks (`outer;...;inner COUNT`, one line per distinct stack).
    #[arg(long = "folded", value_name = "PATH")]
    pub folded: Option<PathBuf>,

    /// Also write a pprof profile (gzipped profile.proto) for `go tool pprof`, Pyroscope,
    /// Parca or Grafana.
    #[arg(long = "pprof", value_name = "PATH")]
    pub pprof: Option<PathBuf>,

    /// Also write the profile as JSON, for scripts (schema: docs/json.md).
    #[arg(long = "json", value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Also write a speedscope profile (https://www.speedscope.app).
    #[arg(long = "speedscope", value_name = "PATH")]
    pub speedscope: Option<PathBuf>,

    /// Also write one self-contained HTML report: the run, every counter, events over
    /// time, a flamegraph per value, the functions with a search box.
    #[arg(long = "report", value_name = "PATH")]
    pub report: Option<PathBuf>,

    /// Name frames `function (file:line)`: each source line of a function is its own frame.
    #[arg(long = "line-numbers")]
    pub line_numbers: bool,

    /// Report what the BPF programs cost: runs and nanoseconds per run, from the
    /// kernel's BPF statistics (enabled for the session).
    #[arg(long = "bpf-stats")]
    pub bpf_stats: bool,

    /// Print where the session's time went, phase by phase (load, verify, guard, launch,
    /// tables, attach, run, read, symbolize, write, teardown), and cargo-trace's peak
    /// memory, when it ends.
    #[arg(long = "timings")]
    pub timings: bool,

    /// Open the report (or the flamegraph) in the desktop's viewer when the run ends.
    #[arg(long = "open")]
    pub open: bool,

    /// No progress line while the target runs (it is drawn only when stderr is a
    /// terminal anyway).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,

    /// Show libbpf's own log (-v: warnings and information, -vv: debug too).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Accept uprobes at raw addresses that are in no known function (or in code that
    /// does not decode), where nothing checks that they start an instruction; one that
    /// does not crashes every process running the file.
    #[arg(long = "unsafe")]
    pub unsafe_addresses: bool,

    /// Distinct stacks the kernel remembers having sent (16 bytes of kernel memory each, as
    /// they appear). Past it, a stack is sent again each time it is met: nothing is lost,
    /// the summary says "known stacks full".
    #[arg(long = "max-stacks", value_name = "N", default_value_t = bpf_prog::Options::default().max_stacks)]
    pub max_stacks: u32,

    /// Distinct (probe, process, stacks) counters the kernel keeps (as they appear). Past
    /// it, events are counted through the ring buffer: the summary says "count map full".
    #[arg(long = "max-counts", value_name = "N", default_value_t = bpf_prog::Options::default().max_counts)]
    pub max_counts: u32,

    /// Processes traced at once (the target and its children, with their mappings and
    /// heap totals). Past it, a child is not followed ("pid filter full" in the summary)
    /// or walks without its mappings until they are read ("process map full", "new
    /// images ring full").
    #[arg(long = "max-processes", value_name = "N", default_value_t = bpf_prog::Options::default().max_procs)]
    pub max_processes: u32,

    /// File mappings (a library or executable at an offset) the kernel knows apart from
    /// the processes mapping them, so that code a process runs before its mappings are
    /// registered (ld.so starting a library) is walked. Past it, such code ends walks
    /// ("file map full" in the summary).
    #[arg(long = "max-files", value_name = "N", default_value_t = bpf_prog::Options::default().max_files)]
    pub max_files: u32,

    /// Processes that exited while traced whose counts stay apart, each under its own
    /// pid (the target's always do). The counts of later ones are added up under pid 0
    /// (said in the summary), so that a program starting short children without end
    /// keeps cargo-trace's memory and the kernel's maps to what its stacks need.
    #[arg(long = "keep-exited", value_name = "N", default_value_t = 1024)]
    pub keep_exited: usize,

    /// With `offcpu`: threads of the traced processes off the CPU at once that are
    /// followed (48 bytes each, allocated at start). Past it, a stay is not counted
    /// ("off-CPU map full" in the summary).
    #[arg(long = "max-off-cpu-threads", value_name = "N", default_value_t = bpf_prog::Options::default().max_off_cpu_threads)]
    pub max_off_cpu_threads: u32,

    /// Unwind-table rows the kernel holds, summed over every object traced (4 bytes each,
    /// allocated at load). An object whose table does not fit walks without it: the run
    /// says which, and walks through it end with "no table" or "no row".
    #[arg(long = "max-table-rows", value_name = "N", default_value_t = bpf_prog::Options::default().max_rows)]
    pub max_table_rows: u32,

    /// Unwind-table pages (4 KiB of code each) the kernel indexes, summed over every
    /// object traced (8 bytes each, allocated at load). Past it, as for --max-table-rows.
    #[arg(long = "max-table-pages", value_name = "N", default_value_t = bpf_prog::Options::default().max_pages)]
    pub max_table_pages: u32,

    /// Distinct unwind rules the kernel holds, summed over every object traced (16 bytes
    /// each, allocated at load). Past it, as for --max-table-rows.
    #[arg(long = "max-table-rules", value_name = "N", default_value_t = bpf_prog::Options::default().max_rules)]
    pub max_table_rules: u32,

    /// Objects (executables and libraries, one table each however many processes map
    /// them) the kernel holds tables for. Past it, as for --max-table-rows.
    #[arg(long = "max-tables", value_name = "N", default_value_t = bpf_prog::Options::default().max_tables)]
    pub max_tables: u32,

    /// Size of the ring buffer that brings new stacks to cargo-trace, in MiB (a power of 2,
    /// at most 1024). When it fills, stacks are late ("stack ring full" in the summary;
    /// one that never arrives is shown as lost).
    #[arg(
        long = "ring-buffer-mib",
        value_name = "MIB",
        default_value_t = bpf_prog::Options::default().record_ring_bytes >> 20,
        value_parser = parse_ring_mib
    )]
    pub ring_buffer_mib: u32,

    /// Don't write the flamegraph SVG (e.g. with --folded only).
    #[arg(long = "no-svg")]
    pub no_svg: bool,

    /// With `offcpu`: count a stay off the CPU only if it lasted at least this long:
    /// microseconds, or a number with a unit (`ns`, `us`, `ms`, `s`), e.g. `1ms`.
    #[arg(long = "min-block", value_name = "TIME", value_parser = parse_min_block, default_value = "0")]
    pub min_block_ns: u64,

    /// Title of the flamegraph (default: the probes and the command).
    #[arg(long = "title", value_name = "TEXT")]
    pub title: Option<String>,

    #[command(flatten)]
    pub alloc: AllocArgs,

    #[command(flatten)]
    pub cargo: CargoArgs,

    /// Arguments passed to the binary cargo builds (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    pub trailing: Vec<String>,
}

fn parse_ring_mib(text: &str) -> Result<u32, String> {
    let mib: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if mib.is_power_of_two() && mib <= 1024 {
        Ok(mib)
    } else {
        Err("must be a power of 2 from 1 to 1024".to_string())
    }
}

/// Heap profiling's command-line options.
#[derive(Debug, Clone, clap::Args)]
pub struct AllocArgs {
    /// With `alloc`: what the flamegraph and folded stacks weigh.
    #[arg(long, value_enum, default_value_t = Metric::Bytes)]
    pub metric: Metric,

    /// With `alloc`: how the text report orders its top stacks.
    #[arg(long = "order-by", value_enum, default_value_t = OrderBy::Bytes)]
    pub order_by: OrderBy,

    /// With `alloc`: write the text report here instead of to stdout.
    #[arg(long = "report-text", value_name = "PATH")]
    pub report_text: Option<PathBuf>,

    /// With `alloc`: write one CSV row per stack, with every counter and histogram bucket.
    #[arg(long = "csv", value_name = "PATH")]
    pub csv: Option<PathBuf>,

    /// With `alloc`: write memory over time as CSV (every 100 ms: live bytes, allocation and
    /// free rates, resident memory).
    #[arg(long = "timeline", value_name = "PATH")]
    pub timeline: Option<PathBuf>,

    /// With `alloc`: write a heaptrack data file for heaptrack_gui and heaptrack_print,
    /// zstd-compressed if PATH ends in .zst, gzip if .gz, else plain text (as heaptrack
    /// reads it). Its event order and timestamps are synthesized from the totals.
    #[arg(long = "heaptrack", value_name = "PATH")]
    pub heaptrack: Option<PathBuf>,

    /// With `alloc`: the prefix of the allocator's functions (e.g. `je_`).
    #[arg(long = "alloc-prefix", value_name = "PREFIX")]
    pub alloc_prefix: Option<String>,

    /// With `alloc`: live blocks tracked at once (recorded in the process: 16 Mi, in
    /// cargo-trace's memory; probed by BPF: 1 Mi, in the kernel's); beyond, blocks are
    /// counted but not tracked (and said so).
    #[arg(long = "max-live-blocks", value_name = "N")]
    pub max_live_blocks: Option<u32>,

    /// With `alloc`: distinct (stack, process) statistics the kernel keeps (about 950
    /// bytes each, as they appear; those of processes that exited leave it). Past it, the
    /// events of a new stack are not counted ("events uncounted (stats map full)" in the
    /// report).
    #[arg(long = "max-heap-stacks", value_name = "N", default_value_t = bpf_prog::AllocOptions::default().max_stacks)]
    pub max_heap_stacks: u32,

    /// With `alloc`: print the top outstanding stacks every interval while the target
    /// runs (e.g. 5s, 500ms), on stderr.
    #[arg(long = "interval", value_name = "DURATION", value_parser = parse_interval)]
    pub interval: Option<Duration>,

    /// With `alloc`: count 1 in N allocating calls, at random; counts and bytes are
    /// scaled estimates.
    #[arg(
        long = "sample-every",
        value_name = "N",
        conflicts_with = "sample_bytes"
    )]
    pub sample_every: Option<u32>,

    /// With `alloc`: count about one allocation per SIZE bytes allocated (an allocation of
    /// s bytes with a chance of s/SIZE), e.g. 512K; bytes are unbiased estimates.
    #[arg(long = "sample-bytes", value_name = "SIZE", value_parser = parse_size)]
    pub sample_bytes: Option<u64>,

    /// With `alloc`: count only allocations of at least SIZE bytes (e.g. 64, 4K).
    #[arg(long = "min-size", value_name = "SIZE", value_parser = parse_size)]
    pub min_size: Option<u64>,

    /// With `alloc`: count only allocations of at most SIZE bytes (e.g. 1M).
    #[arg(long = "max-size", value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,

    /// With `alloc`: a block freed within this many milliseconds is a temporary.
    #[arg(long = "temporary-ms", value_name = "MS", default_value_t = 1.0)]
    pub temporary_ms: f64,

    /// With `alloc` on a launched target: probe libc's allocator functions themselves
    /// rather than run the target with cargo-trace's preloaded library (whose probe sites
    /// cost less per call, but which a process that drops LD_PRELOAD does not load).
    #[arg(long = "no-preload")]
    pub no_preload: bool,

    /// With `alloc`: count the anonymous memory the program maps itself (mmap) as heap
    /// blocks. By default it is shown apart (heaptrack never counts it, bytehound not by
    /// default): totals then compare with theirs.
    #[arg(long = "mmap")]
    pub mmap: bool,
}

/// `512K`, `1M`, `64` (bytes); K, M and G are powers of 1024. At most 4 GiB.
fn parse_size(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => {
            let unit = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("'{text}': the unit is K, M or G")),
            };
            (&text[..at], unit)
        }
        _ => (text, 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|size| (1..=1 << 32).contains(size))
        .ok_or_else(|| format!("'{text}' is not a size from 1 byte to 4G (e.g. 512K)"))
}

/// `5s`, `500ms`, `2.5` (seconds).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.strip_suffix("ms") {
        Some(number) => (number, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * unit)
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("'{text}' is not a positive interval (e.g. 5s, 500ms)"))
}

/// The cargo flags that select and build the target, as cargo-flamegraph takes them.
#[derive(Debug, Default, clap::Args)]
pub struct CargoArgs {
    /// Binary target to build and run.
    #[arg(long, value_name = "NAME")]
    pub bin: Option<String>,
    /// Example target to build and run.
    #[arg(long, value_name = "NAME")]
    pub example: Option<String>,
    /// Test target to build and run.
    #[arg(long, value_name = "NAME")]
    pub test: Option<String>,
    /// Bench target to build and run.
    #[arg(long, value_name = "NAME")]
    pub bench: Option<String>,
    /// Package of the workspace to build (also `-p NAME` when NAME is not a number).
    #[arg(long, value_name = "SPEC")]
    pub package: Option<String>,
    /// Cargo profile to build with (default: release).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Build with the release profile (the default unless --dev or --profile).
    #[arg(long)]
    pub release: bool,
    /// Build with the dev profile.
    #[arg(long, conflicts_with_all = ["release", "profile"])]
    pub dev: bool,
    /// Features to enable.
    #[arg(short = 'F', long, value_name = "FEATURES")]
    pub features: Vec<String>,
    /// Enable all features.
    #[arg(long)]
    pub all_features: bool,
    /// Disable default features.
    #[arg(long)]
    pub no_default_features: bool,
    /// Path to Cargo.toml.
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
}

impl CargoArgs {
    fn build(&self) -> CargoBuild {
        CargoBuild {
            bin: self.bin.clone(),
            example: self.example.clone(),
            test: self.test.clone(),
            bench: self.bench.clone(),
            package: self.package.clone(),
            profile: self.profile.clone(),
            dev: self.dev,
            features: self.features.clone(),
            all_features: self.all_features,
            no_default_features: self.no_default_features,
            manifest_path: self.manifest_path.clone(),
        }
    }
}

impl Cli {
    /// The session's settings and what to write: the command line read once.
    pub fn settings(self) -> Result<(Settings, OutputPlan), String> {
        let files = self.outputs();
        let target = match (self.pid, &self.command) {
            (Some(pid), _) => TargetSpec::Pid(pid),
            (None, Some(command)) => {
                let mut argv = shell_words::split(command)
                    .map_err(|error| format!("cannot split the command '{command}': {error}"))?;
                argv.extend(self.trailing.iter().cloned());
                if argv.is_empty() {
                    return Err("the command given with -c is empty".to_string());
                }
                TargetSpec::Command(argv)
            }
            (None, None) => TargetSpec::Cargo {
                build: self.cargo.build(),
                args: self.trailing.clone(),
            },
        };
        let alloc = &self.alloc;
        let settings = Settings {
            probes: self.probes.clone(),
            target,
            duration: self.duration,
            follow_forks: !self.no_follow_forks,
            unsafe_addresses: self.unsafe_addresses,
            bpf_stats: self.bpf_stats,
            timings: self.timings,
            quiet: self.quiet,
            keep_exited: self.keep_exited,
            min_block_ns: self.min_block_ns,
            capacities: Capacities {
                max_stacks: self.max_stacks,
                max_counts: self.max_counts,
                max_processes: self.max_processes,
                max_files: self.max_files,
                max_off_cpu_threads: self.max_off_cpu_threads,
                max_table_rows: self.max_table_rows,
                max_table_pages: self.max_table_pages,
                max_table_rules: self.max_table_rules,
                max_tables: self.max_tables,
                ring_buffer_bytes: self.ring_buffer_mib << 20,
            },
            heap: HeapSettings {
                alloc_prefix: alloc.alloc_prefix.clone(),
                max_live_blocks: alloc.max_live_blocks,
                max_stacks: alloc.max_heap_stacks,
                temporary: Duration::from_secs_f64(alloc.temporary_ms.max(0.0) / 1e3),
                sample_every: alloc.sample_every.unwrap_or(0),
                sample_bytes: alloc.sample_bytes.unwrap_or(0),
                min_size: alloc.min_size.unwrap_or(0),
                max_size: alloc.max_size.unwrap_or(0),
                interval: alloc.interval,
                preload: !alloc.no_preload,
                count_mmap: alloc.mmap,
            },
        };
        let plan = OutputPlan {
            files,
            metric: alloc.metric,
            order_by: alloc.order_by,
            title: self.title,
            line_numbers: self.line_numbers,
            open: self.open,
        };
        Ok((settings, plan))
    }

    /// Every file to write, in the order they are written.
    fn outputs(&self) -> Vec<(Format, PathBuf)> {
        let mut outputs = Vec::new();
        if !self.no_svg {
            outputs.push((Format::Svg, self.output.clone()));
        }
        if let Some(path) = &self.folded {
            outputs.push((Format::Folded, path.clone()));
        }
        let heaptrack = self
            .alloc
            .heaptrack
            .as_deref()
            .map(|path| Format::Heaptrack(Compression::for_path(path)));
        for (format, path) in [
            (Some(Format::Pprof), &self.pprof),
            (Some(Format::Json), &self.json),
            (Some(Format::Speedscope), &self.speedscope),
            (Some(Format::Html), &self.report),
            (Some(Format::HeapReport), &self.alloc.report_text),
            (Some(Format::Csv), &self.alloc.csv),
            (Some(Format::Timeline), &self.alloc.timeline),
            (heaptrack, &self.alloc.heaptrack),
        ] {
            if let (Some(format), Some(path)) = (format, path) {
                outputs.push((format, path.clone()));
            }
        }
        outputs
    }

    /// Parse the process arguments (`cargo-trace ARGS`: cargo's `trace` word, if any,
    /// dropped). Render an error with [`error_line`]; help and version are printed as clap
    /// has them.
    pub fn from_args(args: Vec<OsString>) -> Result<Self, clap::Error> {
        Self::try_parse_from(normalize_args(args)).map(Self::with_defaults)
    }

    /// No probe means sampling on-CPU stacks at 99 Hz, like a profiler.
    fn with_defaults(mut self) -> Self {
        if self.probes.is_empty() {
            self.probes.push(DEFAULT_PROBE.to_string());
        }
        self
    }
}

/// The longest `-d` taken: a deadline must be a time the clock can reach.
const MAX_DURATION_SECONDS: f64 = 100.0 * 365.25 * 24.0 * 3600.0;

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let seconds = text
        .parse::<f64>()
        .ok()
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
        .ok_or_else(|| format!("'{text}' is not a positive number of seconds"))?;
    if seconds > MAX_DURATION_SECONDS {
        return Err(format!("'{text}' seconds is more than 100 years"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// `--min-block`: nanoseconds from microseconds (offcputime's unit) or `N{ns,us,ms,s}`.
fn parse_min_block(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit {
        "" | "us" => 1_000,
        "ns" => 1,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => {
            return Err(format!(
                "'{text}' is not a time (e.g. 500 for 500 µs, 2ms, 100ns)"
            ))
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("'{text}' is not a time (e.g. 500 for 500 µs, 2ms, 100ns)"))
}

/// The one line an argument error prints (clap's usage and hints left out).
pub fn error_line(error: &clap::Error) -> String {
    let text = error.kind().to_string();
    let rendered = error.to_string();
    let first = rendered
        .lines()
        .next()
        .map(|line| line.trim_start_matches("error: ").to_string())
        .filter(|line| !line.is_empty())
        .unwrap_or(text);
    format!("cargo-trace: error: {first}")
}

const DEFAULT_PROBE: &str = "profile:hz:99";

/// Drop cargo's `trace` subcommand word, and turn `-p VALUE` into `--pid` or
/// `--package` depending on whether VALUE is a process id.
pub fn normalize_args(mut args: Vec<OsString>) -> Vec<OsString> {
    if args.get(1).is_some_and(|word| word == "trace") {
        args.remove(1);
    }
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.into_iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(iter);
            break;
        }
        let text = arg.to_string_lossy().into_owned();
        let (flag_value, inline) = if text == "-p" {
            (iter.next(), false)
        } else if let Some(rest) = text.strip_prefix("-p").filter(|rest| !rest.is_empty()) {
            (Some(OsString::from(rest.trim_start_matches('='))), true)
        } else {
            out.push(arg);
            continue;
        };
        match flag_value {
            Some(value) => {
                // Digits are a pid, even too many for one (an error then, not a package).
                let is_pid = value
                    .to_str()
                    .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
                out.push(if is_pid { "--pid" } else { "--package" }.into());
                out.push(value);
            }
            None if !inline => out.push(arg),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("64"), Ok(64));
        assert!(parse_size("0").is_err());
        assert!(parse_size("5G").is_err());
        assert!(parse_size("3X").is_err());
    }

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("soon").is_err());
    }

    fn parse(words: &[&str]) -> Cli {
        let args = words.iter().map(OsString::from).collect();
        Cli::try_parse_from(normalize_args(args)).expect("parses")
    }

    #[test]
    fn cargo_subcommand_word_is_dropped() {
        let cli = parse(&["cargo-trace", "trace", "profile:hz:99", "-c", "./prog a"]);
        assert_eq!(cli.probes, ["profile:hz:99"]);
        assert_eq!(cli.command.as_deref(), Some("./prog a"));
    }

    #[test]
    fn storage_limits_default_to_the_tracers_and_can_be_raised() {
        let defaults = bpf_prog::Options::default();
        let cli = parse(&["cargo-trace", "uprobe:libc:malloc"]);
        assert_eq!(cli.max_stacks, defaults.max_stacks);
        assert_eq!(cli.max_counts, defaults.max_counts);
        assert_eq!(cli.ring_buffer_mib << 20, defaults.record_ring_bytes);
        assert_eq!(cli.max_processes, defaults.max_procs);
        assert_eq!(cli.max_processes, defaults.max_filtered_pids);
        assert_eq!(cli.max_files, defaults.max_files);
        assert_eq!(cli.alloc.max_heap_stacks, defaults.alloc.max_stacks);
        assert_eq!(cli.alloc.max_live_blocks, None, "each path's own default");
        let cli = parse(&[
            "cargo-trace",
            "--max-stacks",
            "5000000",
            "--max-counts",
            "3000000",
            "--ring-buffer-mib",
            "256",
            "--max-files",
            "1",
            "--max-heap-stacks",
            "200000",
        ]);
        assert_eq!(
            (cli.max_stacks, cli.max_counts, cli.ring_buffer_mib),
            (5_000_000, 3_000_000, 256)
        );
        assert_eq!((cli.max_files, cli.alloc.max_heap_stacks), (1, 200_000));
        let (settings, _) = cli.settings().unwrap();
        assert_eq!(settings.heap.max_stacks, 200_000);
        for bad in ["3", "0", "2048", "x"] {
            let args = ["cargo-trace", "--ring-buffer-mib", bad].map(OsString::from);
            assert!(Cli::try_parse_from(args).is_err(), "{bad}");
        }
    }

    #[test]
    fn dash_p_is_pid_or_package() {
        let cli = parse(&["cargo-trace", "uprobe:libc:malloc", "-p", "1234"]);
        assert_eq!(cli.pid, Some(1234));
        assert_eq!(cli.cargo.package, None);
        let cli = parse(&["cargo-trace", "profile:hz:99", "-p", "server", "--bin", "s"]);
        assert_eq!(cli.pid, None);
        assert_eq!(cli.cargo.package.as_deref(), Some("server"));
    }

    #[test]
    fn huge_numbers_are_errors_not_packages_or_panics() {
        let args = ["cargo-trace", "profile:hz:99", "-p", "99999999999999999999"];
        let error = Cli::try_parse_from(normalize_args(args.map(OsString::from).to_vec()))
            .expect_err("not a pid");
        let line = error_line(&error);
        assert!(line.contains("99999999999999999999"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        for duration in ["1e20", "1e19", "inf", "-1", "0"] {
            let args = ["cargo-trace", "-d", duration, "-c", "true"];
            let error = Cli::try_parse_from(normalize_args(args.map(OsString::from).to_vec()))
                .expect_err(duration);
            assert!(error_line(&error).contains(duration), "{duration}");
        }
        assert_eq!(
            parse_duration("0.5"),
            Ok(std::time::Duration::from_millis(500))
        );
    }

    #[test]
    fn args_after_double_dash_go_to_the_target() {
        let cli = parse(&[
            "cargo-trace",
            "profile:hz:99",
            "--bin",
            "server",
            "--",
            "-p",
            "8080",
        ]);
        assert_eq!(cli.cargo.bin.as_deref(), Some("server"));
        assert_eq!(cli.trailing, ["-p", "8080"]);
        assert_eq!(cli.pid, None);
    }

    #[test]
    fn no_probe_means_profiling() {
        let cli = parse(&["cargo-trace", "trace", "--bin", "server"]).with_defaults();
        assert_eq!(cli.probes, [DEFAULT_PROBE]);
        let cli = parse(&["cargo-trace", "uprobe:libc:malloc", "-c", "x"]).with_defaults();
        assert_eq!(cli.probes, ["uprobe:libc:malloc"]);
    }

    #[test]
    fn several_probes() {
        let cli = parse(&[
            "cargo-trace",
            "uprobe:libc:malloc",
            "uretprobe:libc:malloc",
            "-c",
            "x",
        ]);
        assert_eq!(cli.probes.len(), 2);
        assert_eq!(cli.output, PathBuf::from("flamegraph.svg"));
    }
}
