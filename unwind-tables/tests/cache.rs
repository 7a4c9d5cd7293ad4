//! The on-disk cache: hits return what was stored; stale, corrupt or foreign entries are
//! recompiled and replaced, never trusted and never a panic.

mod common;

use std::path::{Path, PathBuf};

use common::{standard_cie, Cfa as Cfi, EhFrame, Elf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use unwind_tables::cache::{Cache, InvalidEntry, Outcome, Owner, FORMAT_VERSION};
use unwind_tables::{compile_file, DebugSearch};

/// A small object with CFI, and optionally a build-id.
fn write_object(path: &Path, build_id: Option<&[u8]>, cfa_offset: u64) {
    let mut eh = EhFrame::new();
    let cie = eh.cie("zR", &standard_cie());
    eh.fde(
        cie,
        0x1000,
        0x40,
        &Cfi::new().advance(4).def_cfa_offset(cfa_offset),
    );
    let mut elf = Elf::new(0x1000, 0x1000).eh_frame(eh.finish());
    if let Some(id) = build_id {
        elf = elf.build_id(id);
    }
    std::fs::write(path, elf.build()).expect("write object");
}

fn cache_in(dir: &Path) -> Cache {
    Cache::new(dir.join("cache")).with_debug_search(DebugSearch::none())
}

fn entries(cache: &Cache) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(cache.dir())
        .map(|dir| dir.filter_map(|entry| Some(entry.ok()?.path())).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

fn is_hit(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Hit)
}

fn invalid(outcome: &Outcome) -> Option<&InvalidEntry> {
    match outcome {
        Outcome::Compiled { invalid_entry, .. } => invalid_entry.as_ref(),
        Outcome::Hit => None,
    }
}

#[test]
fn second_load_is_a_hit_with_the_same_object() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    let object = dir.path().join("object");
    write_object(&object, Some(&[0xde, 0xad, 0xbe, 0xef]), 16);

    let first = cache.load_or_compile(&object).expect("compiles");
    assert!(matches!(
        first.outcome,
        Outcome::Compiled {
            invalid_entry: None,
            store_error: None
        }
    ));
    let second = cache.load_or_compile(&object).expect("loads");
    assert!(is_hit(&second.outcome), "{:?}", second.outcome);
    assert_eq!(first.object, second.object);
    assert_eq!(
        entries(&cache),
        vec![cache.dir().join("b-deadbeef.ctu")],
        "no temporary files left"
    );

    // Same for a real library, if present.
    if Path::new("/lib/x86_64-linux-gnu/libc.so.6").exists() {
        let compiled = cache
            .load_or_compile("/lib/x86_64-linux-gnu/libc.so.6")
            .expect("compiles libc");
        let loaded = cache
            .load_or_compile("/lib/x86_64-linux-gnu/libc.so.6")
            .expect("loads libc");
        assert!(is_hit(&loaded.outcome));
        assert_eq!(compiled.object, loaded.object);
        assert_eq!(
            loaded.object,
            compile_file("/lib/x86_64-linux-gnu/libc.so.6").unwrap()
        );
    } else {
        eprintln!("SKIP libc part: /lib/x86_64-linux-gnu/libc.so.6 not found");
    }
}

#[test]
fn objects_without_build_id_are_keyed_by_file_identity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    let object = dir.path().join("object");
    write_object(&object, None, 16);
    cache.load_or_compile(&object).expect("compiles");
    let hit = cache.load_or_compile(&object).expect("loads");
    assert!(is_hit(&hit.outcome));
    assert_eq!(
        hit.object.table.lookup(0x1004).kind(),
        unwind_tables::RuleKind::CfaRsp
    );
    assert!(entries(&cache)[0]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("f-"));

    // Replaced by a different file (new inode, as linkers do): a miss, and the new table.
    let replacement = dir.path().join("object.new");
    write_object(&replacement, None, 32);
    std::fs::rename(&replacement, &object).unwrap();
    let reloaded = cache
        .load_or_compile(&object)
        .expect("compiles the new file");
    assert!(!is_hit(&reloaded.outcome));
    assert_ne!(reloaded.object.table, hit.object.table);
}

#[test]
fn invalid_entries_are_recompiled_and_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    let object = dir.path().join("object");
    write_object(&object, Some(&[1, 2, 3, 4]), 16);
    let good = cache.load_or_compile(&object).expect("compiles").object;
    let entry = cache.dir().join("b-01020304.ctu");
    let pristine = std::fs::read(&entry).unwrap();

    let check = |bytes: Vec<u8>, expect: &dyn Fn(&InvalidEntry) -> bool| {
        std::fs::write(&entry, bytes).unwrap();
        let loaded = cache.load_or_compile(&object).expect("recompiles");
        let reason = invalid(&loaded.outcome).expect("entry reported invalid");
        assert!(expect(reason), "unexpected reason {reason:?}");
        assert_eq!(loaded.object, good);
        // Replaced by a good entry.
        assert!(is_hit(&cache.load_or_compile(&object).unwrap().outcome));
    };

    let mut other_format = pristine.clone();
    other_format[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    check(other_format, &|r| {
        matches!(r, InvalidEntry::FormatVersion { .. })
    });

    let mut other_compiler = pristine.clone();
    let version_at = 16; // after magic, format, and the version's u32 length
    other_compiler[version_at] ^= 0x01;
    check(other_compiler, &|r| {
        matches!(r, InvalidEntry::CompilerVersion { .. })
    });

    let mut bad_magic = pristine.clone();
    bad_magic[0] = b'X';
    check(bad_magic, &|r| matches!(r, InvalidEntry::BadMagic));

    let mut flipped = pristine.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    check(flipped, &|r| matches!(r, InvalidEntry::Corrupt(_)));

    check(pristine[..pristine.len() - 3].to_vec(), &|r| {
        matches!(r, InvalidEntry::Corrupt(_))
    });
    check(Vec::new(), &|r| matches!(r, InvalidEntry::BadMagic));

    // A valid entry of another object under this object's name.
    let other = dir.path().join("other");
    write_object(&other, Some(&[9, 9, 9, 9]), 24);
    cache.load_or_compile(&other).unwrap();
    let foreign = std::fs::read(cache.dir().join("b-09090909.ctu")).unwrap();
    check(foreign, &|r| matches!(r, InvalidEntry::KeyMismatch));
}

#[test]
fn mutated_entries_never_panic_or_load_wrong() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    let object = dir.path().join("object");
    write_object(&object, Some(&[5, 6, 7, 8]), 16);
    let good = cache.load_or_compile(&object).unwrap().object;
    let entry = cache.dir().join("b-05060708.ctu");
    let pristine = std::fs::read(&entry).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..500 {
        let mut bytes = pristine.clone();
        for _ in 0..rng.gen_range(1..4) {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] = rng.gen();
        }
        if rng.gen_bool(0.2) {
            bytes.truncate(rng.gen_range(0..bytes.len()));
        }
        std::fs::write(&entry, &bytes).unwrap();
        let loaded = cache.load_or_compile(&object).expect("loads or recompiles");
        // Whatever happened, the object is the right one.
        assert_eq!(loaded.object, good);
    }
}

#[test]
fn unwritable_cache_still_returns_the_object() {
    let dir = tempfile::tempdir().expect("temp dir");
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"a file where the cache dir should be").unwrap();
    let cache = Cache::new(blocker.join("cache")).with_debug_search(DebugSearch::none());
    let object = dir.path().join("object");
    write_object(&object, Some(&[1, 1, 1, 1]), 16);
    let loaded = cache.load_or_compile(&object).expect("compiles");
    assert!(matches!(
        loaded.outcome,
        Outcome::Compiled {
            store_error: Some(_),
            ..
        }
    ));
    assert_eq!(
        loaded.object.table.lookup(0x1004).kind(),
        unwind_tables::RuleKind::CfaRsp
    );
}

#[test]
fn missing_file_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    assert!(matches!(
        cache.load_or_compile(dir.path().join("nope")),
        Err(unwind_tables::Error::Io { .. })
    ));
}

#[test]
fn default_dir_follows_xdg() {
    // The only test that reads these variables, so changing them does not race.
    let dir = Cache::default_dir();
    match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) if Path::new(&xdg).is_absolute() => {
            assert_eq!(dir, Some(PathBuf::from(xdg).join("cargo-trace/unwind")));
        }
        (_, Some(home)) if Path::new(&home).is_absolute() => {
            assert_eq!(
                dir,
                Some(PathBuf::from(home).join(".cache/cargo-trace/unwind"))
            );
        }
        _ => assert_eq!(dir, None),
    }
}

/// Whether the process may give files away (root): the ownership tests need it.
fn can_chown(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipping {test}: giving files to another user needs root");
    }
    root
}

#[test]
fn a_link_planted_under_an_entry_name_is_replaced_not_followed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_in(dir.path());
    let object = dir.path().join("object");
    write_object(&object, Some(&[7, 7, 7, 7]), 16);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::create_dir(cache.dir()).unwrap();
    let entry = cache.dir().join("b-07070707.ctu");
    std::os::unix::fs::symlink(&victim, &entry).unwrap();
    let loaded = cache.load_or_compile(&object).expect("compiles");
    assert!(
        matches!(
            loaded.outcome,
            Outcome::Compiled {
                invalid_entry: Some(InvalidEntry::Unreadable(_)),
                store_error: None
            }
        ),
        "{:?}",
        loaded.outcome
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&entry).unwrap().is_file());
    assert!(matches!(
        cache.load_or_compile(&object).unwrap().outcome,
        Outcome::Hit
    ));
}

#[test]
fn a_cache_directory_that_is_a_link_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    // The link is the cache directory itself, and then a directory on its way.
    for link in [dir.path().join("cache"), dir.path().join("parent")] {
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let cache = Cache::new(link.join(if link.ends_with("parent") {
            "cache"
        } else {
            ""
        }))
        .with_debug_search(DebugSearch::none());
        let object = dir.path().join("object");
        write_object(&object, Some(&[8, 8, 8, 8]), 16);
        let loaded = cache.load_or_compile(&object).expect("compiles");
        let Outcome::Compiled {
            store_error: Some(error),
            ..
        } = loaded.outcome
        else {
            panic!("stored through the link {}", link.display());
        };
        assert!(error.to_string().contains("symbolic link"), "{error}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}

#[test]
fn a_directory_writable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cache = Cache::new(shared.join("cache")).with_debug_search(DebugSearch::none());
    let object = dir.path().join("object");
    write_object(&object, Some(&[9, 9, 9, 9]), 16);
    let loaded = cache.load_or_compile(&object).expect("compiles");
    assert!(
        matches!(loaded.outcome, Outcome::Compiled { store_error: Some(ref e), .. }
            if e.to_string().contains("writable by other users")),
        "{:?}",
        loaded.outcome
    );
    assert!(!shared.join("cache").exists());
}

#[test]
fn the_owner_gets_what_the_cache_creates_and_another_users_directory_is_refused() {
    if !can_chown("cache owner") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let owner = Owner {
        uid: 65534,
        gid: 65534,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(owner.uid), Some(owner.gid)).unwrap();
    let cache = Cache::new(home.join(".cache/cargo-trace/unwind"))
        .with_debug_search(DebugSearch::none())
        .with_owner(owner);
    let object = dir.path().join("object");
    write_object(&object, Some(&[6, 6, 6, 6]), 16);
    let loaded = cache.load_or_compile(&object).expect("compiles");
    assert!(
        matches!(
            loaded.outcome,
            Outcome::Compiled {
                store_error: None,
                ..
            }
        ),
        "{:?}",
        loaded.outcome
    );
    for path in [
        home.join(".cache"),
        home.join(".cache/cargo-trace"),
        cache.dir().to_path_buf(),
        cache.dir().join("b-06060606.ctu"),
    ] {
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            (metadata.uid(), metadata.gid()),
            (owner.uid, owner.gid),
            "{}",
            path.display()
        );
    }
    // As another owner, the same directory is refused and left alone.
    let other = Cache::new(cache.dir())
        .with_debug_search(DebugSearch::none())
        .with_owner(Owner {
            uid: 65533,
            gid: 65533,
        });
    let loaded = other.load_or_compile(&object).expect("compiles");
    assert!(
        matches!(loaded.outcome, Outcome::Compiled { store_error: Some(ref e), .. }
            if e.to_string().contains("another user")),
        "{:?}",
        loaded.outcome
    );
    assert_eq!(entries(&cache).len(), 1);
}
