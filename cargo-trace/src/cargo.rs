//! Build the crate's target with cargo and find the executable it produced.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use cargo_metadata::{Message, TargetKind};

use crate::invoker;

/// The target to build and how, as cargo-flamegraph's flags select it.
#[derive(Clone, Debug, Default)]
pub struct CargoBuild {
    pub bin: Option<String>,
    pub example: Option<String>,
    pub test: Option<String>,
    pub bench: Option<String>,
    pub package: Option<String>,
    /// The cargo profile (release unless `dev` or this).
    pub profile: Option<String>,
    pub dev: bool,
    pub features: Vec<String>,
    pub all_features: bool,
    pub no_default_features: bool,
    pub manifest_path: Option<PathBuf>,
}

/// Build the selected target (release by default, with debug info so stacks
/// symbolize) and return the path of its executable.
pub fn build(args: &CargoBuild) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--message-format=json-render-diagnostics");
    if let Some(profile) = &args.profile {
        command.args(["--profile", profile]);
    } else if !args.dev {
        command.arg("--release");
        // Function names with their paths (line tables alone name functions
        // without their module), unless the user configured the debug info.
        if std::env::var_os("CARGO_PROFILE_RELEASE_DEBUG").is_none() {
            command.env("CARGO_PROFILE_RELEASE_DEBUG", "limited");
        }
    }
    let selections = [
        ("--bin", &args.bin),
        ("--example", &args.example),
        ("--test", &args.test),
        ("--bench", &args.bench),
        ("--package", &args.package),
    ];
    for (flag, value) in selections {
        if let Some(value) = value {
            command.args([flag, value]);
        }
    }
    for features in &args.features {
        command.args(["--features", features]);
    }
    if args.all_features {
        command.arg("--all-features");
    }
    if args.no_default_features {
        command.arg("--no-default-features");
    }
    if let Some(manifest) = &args.manifest_path {
        command.arg("--manifest-path").arg(manifest);
    }
    command.stdout(Stdio::piped());
    // Under sudo the build is the user's: `target/` and `~/.cargo` stay theirs, as when
    // they run cargo themselves.
    let builder = invoker::sudo_user().and_then(|owner| {
        let account = nix::unistd::User::from_uid(owner.uid.into()).ok()??;
        command
            .uid(owner.uid)
            .gid(owner.gid)
            .env("HOME", &account.dir)
            .env("USER", &account.name)
            .env("LOGNAME", &account.name);
        Some(account.name)
    });
    let mut child = command.spawn().with_context(|| match &builder {
        Some(user) => format!(
            "running cargo build as {user}, who ran sudo (their cargo must be on PATH or \
             in CARGO; or build as {user} and give the binary with -c)"
        ),
        None => "running cargo build".to_string(),
    })?;
    let stdout = child.stdout.take().context("cargo build's output")?;
    let mut executables = Vec::new();
    for message in Message::parse_stream(std::io::BufReader::new(stdout)) {
        if let Message::CompilerArtifact(artifact) = message.context("reading cargo's output")? {
            let wanted = match (&args.test, &args.bench, &args.example) {
                (Some(_), _, _) => artifact.target.kind.contains(&TargetKind::Test),
                (_, Some(_), _) => artifact.target.kind.contains(&TargetKind::Bench),
                (_, _, Some(_)) => artifact.target.kind.contains(&TargetKind::Example),
                _ => artifact.target.kind.contains(&TargetKind::Bin),
            };
            if let (true, Some(executable)) = (wanted, artifact.executable) {
                executables.push((artifact.target.name, executable.into_std_path_buf()));
            }
        }
    }
    let status = child.wait().context("waiting for cargo build")?;
    if !status.success() {
        bail!("cargo build failed ({status})");
    }
    match executables.len() {
        0 => bail!(
            "cargo built no executable target; choose one with --bin, --example, --test or --bench"
        ),
        1 => Ok(executables.remove(0).1),
        _ => {
            let names: Vec<_> = executables.iter().map(|(name, _)| name.as_str()).collect();
            bail!(
                "several executables were built ({}); choose one with --bin NAME",
                names.join(", ")
            )
        }
    }
}
