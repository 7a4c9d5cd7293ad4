//! Whom a run works for: the files it leaves behind (outputs, the unwind cache) belong to
//! them, not to root.
//!
//! cargo-trace needs root, usually through sudo, on machines where the user who typed the
//! command owns the working directory and the home the cache lives in. Files root creates
//! there would be root's, which the user could then neither replace nor remove. Under sudo
//! (`SUDO_UID`/`SUDO_GID` set while running as root) the invoking user owns what is
//! created, and the cache lives in their home as the password database names it (sudo may
//! keep or reset `HOME`; neither is theirs to point elsewhere through a root process).
//! Run as root without sudo, root owns everything and the cache follows `XDG_CACHE_HOME` or
//! `HOME`, where the cache refuses any directory that is not root's.

use unwind_tables::cache::{Cache, Owner};

/// The user sudo ran cargo-trace for, if it runs as root under sudo.
pub fn sudo_user() -> Option<Owner> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let id = |var: &str| std::env::var(var).ok()?.parse::<u32>().ok();
    let owner = Owner {
        uid: id("SUDO_UID")?,
        gid: id("SUDO_GID")?,
    };
    // root sudo'ing to itself is root.
    (owner.uid != 0).then_some(owner)
}

/// Who owns the files the run creates: the sudo user, else the process's own user.
pub fn owner() -> Owner {
    sudo_user().unwrap_or_else(Owner::current)
}

/// The unwind cache of the user the run works for; `None` when there is no home for it.
pub fn unwind_cache() -> Option<Cache> {
    let Some(owner) = sudo_user() else {
        return Cache::default_dir().map(Cache::new);
    };
    let user = nix::unistd::User::from_uid(owner.uid.into()).ok()??;
    let dir = user.dir.join(".cache/cargo-trace/unwind");
    Some(Cache::new(dir).with_owner(owner))
}

/// The groups `owner` belongs to: their primary group and the supplementary ones the group
/// database gives them.
pub fn groups(owner: Owner) -> Vec<u32> {
    let user = nix::unistd::User::from_uid(owner.uid.into()).ok().flatten();
    let supplementary = user.and_then(|user| {
        let name = std::ffi::CString::new(user.name).ok()?;
        nix::unistd::getgrouplist(&name, owner.gid.into()).ok()
    });
    let mut groups: Vec<u32> = supplementary
        .unwrap_or_default()
        .into_iter()
        .map(|gid| gid.as_raw())
        .collect();
    groups.push(owner.gid);
    groups
}
