//! Finding functions by name in an ELF file's symbols: mangled, demangled Rust (without
//! hash, with or without generic arguments), demangled C++ (with or without arguments),
//! or a `*` pattern; and, when nothing matches, the names the user probably meant.

use std::collections::BTreeMap;

use process_image::Demangled;

use super::MAX_LISTED;
use crate::elf::{ElfInfo, Function};
use crate::error::ResolveError;
use crate::suggest::{edit_distance, typo_limit};
use crate::wildcard::{has_wildcard, matches};

/// The names a function answers to: its demangled names, and for Rust the name without
/// trailing generic arguments (v0 mangling keeps them): `myprog::parse` for
/// `myprog::parse::<u32>`.
pub(super) struct Names {
    demangled: Demangled,
    rust_base: Option<String>,
}

impl Names {
    pub(super) fn of(raw: &str) -> Names {
        let demangled = Demangled::of(raw);
        let rust_base = demangled
            .rust
            .as_deref()
            .and_then(strip_generic_arguments)
            .map(str::to_string);
        Names {
            demangled,
            rust_base,
        }
    }

    /// The name to show.
    fn display(&self) -> &str {
        self.demangled.display()
    }

    /// The short name to compare with a misspelt query.
    fn short(&self) -> &str {
        let names = &self.demangled;
        names
            .rust
            .as_deref()
            .or(names.cpp_short.as_deref())
            .unwrap_or(&names.raw)
    }

    fn matches_demangled(&self, query: &str) -> bool {
        let names = &self.demangled;
        if names.rust.as_deref() == Some(query) || self.rust_base.as_deref() == Some(query) {
            return true;
        }
        // Spacing in C++ argument lists varies ("f(int,char)" and "f(int, char)").
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        let query = squeeze(query);
        [&names.cpp_short, &names.cpp_full]
            .into_iter()
            .flatten()
            .any(|name| squeeze(name) == query)
    }

    fn matches_pattern(&self, pattern: &str) -> bool {
        let names = &self.demangled;
        [
            Some(&names.raw),
            names.rust.as_ref(),
            names.cpp_short.as_ref(),
            names.cpp_full.as_ref(),
        ]
        .into_iter()
        .flatten()
        .any(|name| matches(pattern, name))
    }
}

/// `f::generic::<u32>` → `f::generic`; `None` when the name ends in no generic arguments.
pub(super) fn strip_generic_arguments(name: &str) -> Option<&str> {
    if !name.ends_with('>') {
        return None;
    }
    let bytes = name.as_bytes();
    let mut depth = 0usize;
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            // The `>` of `->` (in `fn() -> T`) closes nothing.
            b'>' if i > 0 && bytes[i - 1] == b'-' => {}
            b'>' => depth += 1,
            b'<' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return name[..i].strip_suffix("::");
                }
            }
            _ => {}
        }
    }
    None
}

pub(super) fn display_name(raw: &str) -> String {
    Names::of(raw).display().to_string()
}

/// The functions `query` names, one per distinct address, with display names.
/// `all`: several addresses are all wanted (a pattern, or C++ overloads).
pub(super) fn find_functions<'a>(
    info: &'a ElfInfo,
    query: &str,
    all: bool,
) -> Result<Vec<(&'a Function, String)>, ResolveError> {
    let pattern = has_wildcard(query);
    let exact: Vec<&Function> = if pattern {
        Vec::new()
    } else {
        info.functions.iter().filter(|f| f.name == query).collect()
    };
    let (found, names): (Vec<&Function>, Option<Vec<Names>>) = if !exact.is_empty() {
        (exact, None)
    } else {
        let names: Vec<Names> = info.functions.iter().map(|f| Names::of(&f.name)).collect();
        let found = info
            .functions
            .iter()
            .zip(&names)
            .filter(|(_, n)| {
                if pattern {
                    n.matches_pattern(query)
                } else {
                    n.matches_demangled(query)
                }
            })
            .map(|(f, _)| f)
            .collect();
        (found, Some(names))
    };
    let mut found = found;
    // GCC's clones of a function (`f() [clone .isra.0]`) answer to its name only when
    // the original is gone; a `.cold` part is never an entry.
    if !pattern {
        found.retain(|f| f.name == query || !f.name.contains(".cold"));
        if found.iter().any(|f| !is_clone(&f.name)) {
            found.retain(|f| !is_clone(&f.name));
        }
    }

    if found.is_empty() {
        let names =
            names.unwrap_or_else(|| info.functions.iter().map(|f| Names::of(&f.name)).collect());
        let suggestions = suggestions(query, &names);
        return Err(if info.has_symtab {
            ResolveError::SymbolNotFound {
                symbol: query.to_string(),
                path: info.path.clone(),
                suggestions,
            }
        } else {
            ResolveError::Stripped {
                symbol: query.to_string(),
                path: info.path.clone(),
                exported: info.functions.len(),
                suggestions,
            }
        });
    }

    // One function per address: prefer an IFUNC's own name to other names of its
    // resolver, then .symtab and default symbol versions.
    let mut by_address: BTreeMap<u64, &Function> = BTreeMap::new();
    let rank = |f: &Function| (!f.ifunc, f.dynamic, f.hidden_version);
    for f in found {
        let entry = by_address.entry(f.address).or_insert(f);
        if rank(f) < rank(entry) {
            *entry = f;
        }
    }
    let mut chosen: Vec<&Function> = by_address.into_values().collect();
    if !all && chosen.len() > 1 {
        // `memcpy` is both `memcpy@GLIBC_2.2.5` and the default `memcpy@@GLIBC_2.14`.
        if chosen.iter().any(|f| !f.hidden_version) {
            chosen.retain(|f| !f.hidden_version);
        }
    }
    if !all && chosen.len() > 1 {
        let count = chosen.len();
        let candidates = chosen
            .iter()
            .take(MAX_LISTED)
            .map(|f| {
                let shown = display_name(&f.name);
                if shown == f.name {
                    format!("{shown} at {:#x}", f.address)
                } else {
                    format!("{shown} ({}) at {:#x}", f.name, f.address)
                }
            })
            .collect();
        return Err(ResolveError::AmbiguousSymbol {
            symbol: query.to_string(),
            path: info.path.clone(),
            candidates,
            count,
        });
    }
    Ok(chosen
        .into_iter()
        .map(|f| (f, display_name(&f.name)))
        .collect())
}

/// A compiler-made copy of a function, named `NAME.isra.0`, `NAME.constprop.0`, ...
/// (Rust's `.llvm.N` suffix only renames the function itself).
fn is_clone(raw: &str) -> bool {
    raw.contains('.') && !raw.contains(".llvm.")
}

/// The last component of a path: `parse` of `myprog::cli::parse`.
fn last_component(name: &str) -> &str {
    let name = name.split('(').next().unwrap_or(name);
    name.rsplit("::").next().unwrap_or(name)
}

/// Up to [`MAX_LISTED`] names close to a query that matched nothing: the same last
/// component in another module, names containing it (or contained in it), then typos.
pub(super) fn suggestions(query: &str, names: &[Names]) -> Vec<String> {
    let query_last = last_component(query.trim_matches('*'));
    let query_lower = query.trim_matches('*').to_lowercase();
    let limit = typo_limit(query);
    let mut scored: Vec<(usize, String)> = Vec::new();
    for names in names {
        let short = names.short();
        let score = if !query_last.is_empty() && last_component(short) == query_last {
            Some(0)
        } else if query_lower.len() >= 3
            && (short.to_lowercase().contains(&query_lower)
                || (short.len() >= 3 && query_lower.contains(&short.to_lowercase())))
        {
            Some(1)
        } else {
            // A typo in the whole name beats one in the last component only.
            edit_distance(query, short, limit)
                .map(|d| 2 + d)
                .or_else(|| {
                    edit_distance(query_last, last_component(short), typo_limit(query_last))
                        .map(|d| 6 + d)
                })
        };
        if let Some(score) = score {
            scored.push((score, short.to_string()));
        }
    }
    scored.sort();
    let mut out: Vec<String> = Vec::new();
    for (_, name) in scored {
        if !out.contains(&name) {
            out.push(name);
            if out.len() == MAX_LISTED {
                break;
            }
        }
    }
    out
}
