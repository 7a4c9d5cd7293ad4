//! The server's private directory: where the library is loaded from must be a path no
//! other user can change (issue 24's attack: a user who owns `$TMPDIR` swapped the
//! library and had it run as root), and nothing is left behind.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use preload::Server;

#[test]
fn the_library_lies_in_a_directory_only_root_can_change() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: not root (the directory is then under XDG_RUNTIME_DIR)");
        return;
    }
    let server = Server::new().unwrap();
    let library = server.library_path().to_path_buf();
    let dir = library.parent().unwrap().to_path_buf();
    assert!(dir.starts_with("/run/cargo-trace"), "{}", dir.display());
    assert_eq!(std::fs::read(&library).unwrap(), preload::LIBRARY);
    let mut ancestor = Some(library.as_path());
    while let Some(path) = ancestor {
        let meta = std::fs::symlink_metadata(path).unwrap();
        assert_eq!(meta.uid(), 0, "{}", path.display());
        assert_eq!(
            meta.mode() & 0o022,
            0,
            "{} is writable by others",
            path.display()
        );
        ancestor = path.parent();
    }
    // TMPDIR plays no part
    assert!(!library.starts_with(std::env::temp_dir()) || std::env::temp_dir() == dir);

    // a real unprivileged user can neither move the directory away nor plant a file
    let attack = format!(
        "mv {dir} {dir}.away 2>/dev/null && echo moved; \
         cp /bin/true {dir}/planted 2>/dev/null && echo planted; \
         cp /bin/true {lib} 2>/dev/null && echo replaced; true",
        dir = dir.display(),
        lib = library.display()
    );
    match Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            &attack,
        ])
        .output()
    {
        Ok(out) => {
            assert!(out.status.success(), "{out:?}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "",
                "the attack went through"
            );
        }
        Err(error) => eprintln!("skipping the unprivileged attack: no setpriv ({error})"),
    }
    assert_eq!(std::fs::read(&library).unwrap(), preload::LIBRARY);

    let socket = server.socket_path().to_path_buf();
    drop(server);
    assert!(
        !dir.exists() && !socket.exists(),
        "the directory goes with the server"
    );
}
