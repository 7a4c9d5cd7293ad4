//! `--open`: shows what a run wrote in the desktop's viewer (`xdg-open`), as the user who
//! ran sudo when there is one: a browser started as root is neither safe nor theirs.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::invoker;

/// Opens `path` with `xdg-open`, without waiting for the viewer. Says in one line why not
/// when there is no desktop or the opener cannot be started.
pub fn open(path: &Path) -> Result<(), String> {
    let desktop = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|value| !value.is_empty()));
    if !desktop {
        return Err(format!(
            "--open: no desktop here (DISPLAY and WAYLAND_DISPLAY are unset); open {} yourself",
            path.display()
        ));
    }
    let mut command = Command::new("xdg-open");
    command
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(user) = invoker::sudo_user() {
        command.uid(user.uid).gid(user.gid);
        if let Ok(Some(account)) = nix::unistd::User::from_uid(user.uid.into()) {
            command.env("HOME", account.dir).env("USER", account.name);
        }
    }
    command.spawn().map(drop).map_err(|error| {
        format!(
            "--open: cannot run xdg-open ({error}); open {} yourself",
            path.display()
        )
    })
}
