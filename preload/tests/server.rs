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

/// A peer that is not the library (garbage, or a region of the wrong size) is dropped,
/// and nothing of it reaches the recorder.
#[test]
fn a_bad_hello_is_dropped() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 && std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        eprintln!("skipping: no private directory for the socket");
        return;
    }
    let mut server = Server::new().unwrap();
    let mut recorder = preload::Recorder::new(preload::Options::default());
    let mut tables = preload::PlainTables::new();
    for message in [&b"garbage!"[..], &[0u8; 24][..]] {
        let socket = connect(server.socket_path());
        // SAFETY: a connected socket we own; the buffer is valid for its length.
        let sent = unsafe { libc::send(socket, message.as_ptr().cast(), message.len(), 0) };
        assert_eq!(sent, message.len() as isize);
        for _ in 0..10 {
            server
                .serve(
                    &mut tables,
                    &mut recorder,
                    std::time::Duration::from_millis(20),
                )
                .unwrap();
        }
        assert_eq!(server.connections(), 0, "the peer is dropped");
        assert_eq!(recorder.regions(), 0);
        // SAFETY: closing the socket we opened.
        unsafe { libc::close(socket) };
    }
}

fn connect(path: &std::path::Path) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain arguments.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
    assert!(fd >= 0);
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: a valid address of the size given.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    fd
}
