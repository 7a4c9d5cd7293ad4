//! Builds the fixture programs of `tests/fixtures` from source, once per change.
//!
//! Each fixture is compiled into `<target>/fixtures/<name>` with the flags of
//! its language (no frame pointers in any of them). A stamp file beside the
//! binary records a fingerprint of the source, the flags and the compiler's
//! version; a binary whose stamp matches is reused, so a test run compiles
//! each fixture at most once and a changed source is rebuilt. An exclusive
//! `flock` on `<target>/fixtures/.lock` serializes builds across the threads
//! of one test binary and across test binaries run in parallel.
//!
//! `<target>` is `$CARGO_TARGET_DIR` when set, else the workspace's `target/`.
//!
//! A fixture that needs crates from crates.io is a crate of its own under
//! `tests/fixtures/<name>/` (see [`cargo_fixture`]).

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use nix::fcntl::{Flock, FlockArg};

/// A fixture's language, which decides its source extension, compiler and flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lang {
    /// `<name>.rs`, one file, no dependencies: `rustc -C opt-level=3
    /// -C force-frame-pointers=no -C debuginfo=2 -C codegen-units=1`.
    Rust,
    /// `<name>.c`: `gcc -O2 -g -fomit-frame-pointer -fPIE -pie -pthread`.
    C,
    /// `<name>.cpp`: `g++ -O2 -g -fomit-frame-pointer -fexceptions`.
    Cpp,
}

impl Lang {
    fn extension(self) -> &'static str {
        match self {
            Lang::Rust => "rs",
            Lang::C => "c",
            Lang::Cpp => "cpp",
        }
    }

    /// The compiler: `$RUSTC`, `$CC` or `$CXX` when set, else rustc, gcc, g++.
    fn compiler(self) -> String {
        let (var, default) = match self {
            Lang::Rust => ("RUSTC", "rustc"),
            Lang::C => ("CC", "gcc"),
            Lang::Cpp => ("CXX", "g++"),
        };
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string())
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Lang::Rust => &[
                "--edition",
                "2021",
                "-C",
                "opt-level=3",
                "-C",
                "force-frame-pointers=no",
                "-C",
                "debuginfo=2",
                "-C",
                "codegen-units=1",
            ],
            Lang::C => &[
                "-O2",
                "-g",
                "-fomit-frame-pointer",
                "-fPIE",
                "-pie",
                "-pthread",
            ],
            Lang::Cpp => &["-O2", "-g", "-fomit-frame-pointer", "-fexceptions"],
        }
    }
}

/// Why a fixture could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("fixture source {path} does not exist")]
    NoSource { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run {compiler}: {source}")]
    NoCompiler {
        compiler: String,
        source: std::io::Error,
    },
    #[error("locking {path}: {source}")]
    Lock { path: PathBuf, source: nix::Error },
    #[error("{command} failed ({status}):\n{stderr}")]
    Compile {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// Builds (or reuses) the Rust fixture `tests/fixtures/<name>.rs`. Panics with
/// the compiler's output when it cannot be built.
pub fn rust_fixture(name: &str) -> PathBuf {
    fixture(Lang::Rust, name)
}

/// Builds (or reuses) the C fixture `tests/fixtures/<name>.c`.
pub fn c_fixture(name: &str) -> PathBuf {
    fixture(Lang::C, name)
}

/// Builds (or reuses) the C++ fixture `tests/fixtures/<name>.cpp`.
pub fn cpp_fixture(name: &str) -> PathBuf {
    fixture(Lang::Cpp, name)
}

/// [`rust_fixture`], [`c_fixture`] or [`cpp_fixture`] by language.
pub fn fixture(lang: Lang, name: &str) -> PathBuf {
    build(lang, name, &[]).unwrap_or_else(|error| panic!("building fixture {name}: {error}"))
}

/// The source file of a fixture.
pub fn source_path(lang: Lang, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("{name}.{}", lang.extension()))
}

/// Where fixtures are built: `<target>/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        });
    target.join("fixtures")
}

/// Builds a fixture with `extra_flags` appended to its language's flags (a
/// later flag overrides an earlier one, e.g. `-fno-omit-frame-pointer`). With
/// extra flags the binary is named `<name>-<fingerprint of the flags>`, so it
/// never replaces the standard build.
pub fn build(lang: Lang, name: &str, extra_flags: &[&str]) -> Result<PathBuf, FixtureError> {
    build_source(lang, &source_path(lang, name), name, extra_flags)
}

/// [`build`] from any source file, into `<target>/fixtures/<name>`.
pub fn build_source(
    lang: Lang,
    source: &Path,
    name: &str,
    extra_flags: &[&str],
) -> Result<PathBuf, FixtureError> {
    let source = source.to_path_buf();
    let code = fs::read(&source).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => FixtureError::NoSource {
            path: source.clone(),
        },
        _ => FixtureError::Io {
            what: "reading",
            path: source.clone(),
            source: error,
        },
    })?;
    let compiler = lang.compiler();
    let version = compiler_version(&compiler)?;

    let mut fingerprint = Fnv::new();
    for part in [compiler.as_bytes(), version.as_bytes(), &code] {
        fingerprint.add(part);
    }
    for flag in lang.flags().iter().chain(extra_flags) {
        fingerprint.add(flag.as_bytes());
    }
    let stamp = format!("{:016x}\n", fingerprint.0);

    let dir = fixtures_dir();
    fs::create_dir_all(&dir).map_err(|source| FixtureError::Io {
        what: "creating",
        path: dir.clone(),
        source,
    })?;
    let output = if extra_flags.is_empty() {
        dir.join(name)
    } else {
        let mut flags = Fnv::new();
        extra_flags
            .iter()
            .for_each(|flag| flags.add(flag.as_bytes()));
        dir.join(format!("{name}-{:08x}", flags.0 as u32))
    };
    let stamp_path = output.with_extension("stamp");

    let _lock = lock(&dir.join(".lock"))?;
    if output.exists() && fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp) {
        return Ok(output);
    }
    let partial = output.with_extension(format!("partial-{}", std::process::id()));
    let mut command = Command::new(&compiler);
    command.args(lang.flags()).args(extra_flags);
    if lang == Lang::Rust {
        command.args(["--crate-name", name]);
    }
    command.arg("-o").arg(&partial).arg(&source);
    let result = command
        .output()
        .map_err(|source| FixtureError::NoCompiler {
            compiler: compiler.clone(),
            source,
        })?;
    if !result.status.success() {
        let _ = fs::remove_file(&partial);
        return Err(FixtureError::Compile {
            command: format!("{command:?}"),
            status: result.status,
            stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
        });
    }
    publish(&partial, output, &stamp_path, &stamp)
}

/// Builds (or reuses) the Cargo fixture `tests/fixtures/<name>/` (a crate of its own
/// workspace, with its own Cargo.lock, whose dependencies come from crates.io) with
/// `features`, in release mode without frame pointers, its C dependencies too
/// (`-fomit-frame-pointer` in `CFLAGS`: the cc crate asks for frame pointers when debug
/// info is on). The binary is copied to `<target>/fixtures/<name>-<features>`; cargo's
/// own build directory, `<target>/fixtures/cargo`, is kept, so a changed fixture rebuilds
/// only itself. A stamp over the crate's files, the features and the toolchain's version
/// skips cargo altogether when nothing changed.
pub fn cargo_fixture(name: &str, features: &str) -> Result<PathBuf, FixtureError> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    let manifest = crate_dir.join("Cargo.toml");
    if !manifest.exists() {
        return Err(FixtureError::NoSource { path: manifest });
    }
    let cargo = std::env::var("CARGO")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "cargo".to_string());
    let mut fingerprint = Fnv::new();
    for part in [
        compiler_version(&cargo)?,
        compiler_version(&Lang::Rust.compiler())?,
        features.to_string(),
        CARGO_RUSTFLAGS.to_string(),
        CARGO_CFLAGS.to_string(),
    ] {
        fingerprint.add(part.as_bytes());
    }
    for file in crate_files(&crate_dir)? {
        fingerprint.add(file.as_os_str().as_encoded_bytes());
        fingerprint.add(&fs::read(&file).map_err(|source| FixtureError::Io {
            what: "reading",
            path: file.clone(),
            source,
        })?);
    }
    let stamp = format!("{:016x}\n", fingerprint.0);

    let dir = fixtures_dir();
    fs::create_dir_all(&dir).map_err(|source| FixtureError::Io {
        what: "creating",
        path: dir.clone(),
        source,
    })?;
    let output = dir.join(format!("{name}-{}", features.replace([',', ' '], "-")));
    let stamp_path = output.with_extension("stamp");
    let _lock = lock(&dir.join(".lock"))?;
    if output.exists() && fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp) {
        return Ok(output);
    }
    let target_dir = dir.join("cargo");
    let mut command = Command::new(&cargo);
    command
        .args(["build", "--release", "--locked", "--quiet"])
        .args(["--features", features])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&crate_dir)
        // What an enclosing cargo or the user set would change the flags.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env("RUSTFLAGS", CARGO_RUSTFLAGS)
        .env("CFLAGS", CARGO_CFLAGS);
    let result = command
        .output()
        .map_err(|source| FixtureError::NoCompiler {
            compiler: cargo.clone(),
            source,
        })?;
    if !result.status.success() {
        return Err(FixtureError::Compile {
            command: format!("{command:?}"),
            status: result.status,
            stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
        });
    }
    // Copied, not moved: cargo keeps its build fresh.
    let built = target_dir.join("release").join(name);
    let partial = output.with_extension(format!("partial-{}", std::process::id()));
    fs::copy(&built, &partial).map_err(|source| FixtureError::Io {
        what: "copying",
        path: built.clone(),
        source,
    })?;
    publish(&partial, output, &stamp_path, &stamp)
}

/// The Rust flags of a Cargo fixture (its profile sets the rest: debug info, one codegen
/// unit).
const CARGO_RUSTFLAGS: &str = "-C force-frame-pointers=no";

/// The C flags of a Cargo fixture's C dependencies, after the cc crate's own.
const CARGO_CFLAGS: &str = "-fomit-frame-pointer";

/// The files of a Cargo fixture that decide its build, in a stable order: Cargo.toml,
/// Cargo.lock and everything under `src/`.
fn crate_files(crate_dir: &Path) -> Result<Vec<PathBuf>, FixtureError> {
    let mut files = vec![crate_dir.join("Cargo.toml"), crate_dir.join("Cargo.lock")];
    let mut pending = vec![crate_dir.join("src")];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(|source| FixtureError::Io {
            what: "listing",
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| FixtureError::Io {
                    what: "listing",
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files[2..].sort();
    Ok(files)
}

/// `<compiler> --version`, run once per process and compiler.
fn compiler_version(compiler: &str) -> Result<String, FixtureError> {
    static VERSIONS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let versions = VERSIONS.get_or_init(Default::default);
    if let Some(version) = versions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(compiler)
    {
        return Ok(version.clone());
    }
    let output = Command::new(compiler)
        .arg("--version")
        .output()
        .map_err(|source| FixtureError::NoCompiler {
            compiler: compiler.to_string(),
            source,
        })?;
    let version = String::from_utf8_lossy(&output.stdout).into_owned();
    versions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(compiler.to_string(), version.clone());
    Ok(version)
}

/// An exclusive lock on `path`, held until the value is dropped.
fn lock(path: &Path) -> Result<Flock<File>, FixtureError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| FixtureError::Io {
            what: "opening",
            path: path.to_path_buf(),
            source,
        })?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, source)| FixtureError::Lock {
        path: path.to_path_buf(),
        source,
    })
}

/// FNV-1a, 64-bit: a fingerprint that is stable across Rust versions (unlike
/// `DefaultHasher`), with each part's length mixed in so parts cannot shift.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, bytes: &[u8]) {
        for byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Renames a fixture built at `partial` into place at `output` and writes its stamp.
fn publish(
    partial: &Path,
    output: PathBuf,
    stamp_path: &Path,
    stamp: &str,
) -> Result<PathBuf, FixtureError> {
    fs::rename(partial, &output).map_err(|source| FixtureError::Io {
        what: "renaming to",
        path: output.clone(),
        source,
    })?;
    fs::write(stamp_path, stamp).map_err(|source| FixtureError::Io {
        what: "writing",
        path: stamp_path.to_path_buf(),
        source,
    })?;
    Ok(output)
}
