//! The workspace's shape, checked from its sources: imports run one way inside every
//! crate (the largest circle of modules that import each other is at most 2: a parent
//! and its child), no file of the binary crate outgrows its job (800 lines), and the
//! profile model knows nothing of BPF (no libbpf in its dependency tree).
//!
//! The modules compared are a crate's top-level modules (`a.rs` or `a/`, with every
//! module inside: what a submodule imports, its top-level module imports). One imports
//! another when code outside comments names it through `crate::`, `super::`, `self::`
//! or one of its declared child modules; an item the crate root re-exports
//! (`pub use a::Item`) is named where it is defined. The root itself, which declares
//! and re-exports, is no module of the circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose modules are checked, by directory.
const CRATES: &[&str] = &[
    "unwind-tables",
    "process-image",
    "bpf-prog",
    "probes",
    "profile",
    "preload",
    "cargo-trace",
    "tests",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The module path of `file` under `src`: `["collect", "bpf"]` for
/// `src/collect/bpf/mod.rs`, `[]` for the crate root.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        name => parts.push(name.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// The code of `text` without comments and string contents (roughly: line comments,
/// block comments, and the inside of string literals).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_string = false;
                out.push('"');
            }
            i += 1;
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
            continue;
        }
        // A char literal '"' must not open a string.
        if c == b'\'' && bytes.get(i + 1) == Some(&b'"') && bytes.get(i + 2) == Some(&b'\'') {
            i += 3;
            continue;
        }
        if c == b'"' {
            in_string = true;
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// The paths `code` names: each a sequence of identifiers joined by `::`, with the
/// words of a `{a, b::c}` group expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    paths_of_length(code, 2)
}

/// The paths of at least `shortest` identifiers in `code` (inside a group, one will do).
fn paths_of_length(code: &str, shortest: usize) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        if !ident(chars[i]) || (i > 0 && (ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < chars.len() && ident(chars[j]) {
                j += 1;
            }
            path.push(chars[start..j].iter().collect::<String>());
            if chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
                j += 2;
                if chars.get(j) == Some(&'{') {
                    // A group: every path in it, under this prefix.
                    let mut depth = 0;
                    let open = j;
                    while j < chars.len() {
                        match chars[j] {
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    let inner: String = chars[open + 1..j.min(chars.len())].iter().collect();
                    for item in paths_of_length(&inner, 1) {
                        let mut full = path.clone();
                        full.extend(item);
                        found.push(full);
                    }
                    path.clear();
                    break;
                }
                if j < chars.len() && ident(chars[j]) {
                    continue;
                }
            }
            break;
        }
        if path.len() >= shortest && !path[0].is_empty() {
            found.push(path);
        }
        i = j.max(i + 1);
    }
    found
}

/// Each top-level module of a crate and the top-level modules it imports.
fn import_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, targets) in file_graph(src) {
        let Some(top) = module.first() else {
            continue;
        };
        let edges = graph.entry(vec![top.clone()]).or_default();
        for target in targets {
            match target.first() {
                Some(other) if other != top => {
                    edges.insert(vec![other.clone()]);
                }
                _ => {}
            }
        }
    }
    graph
}

/// The items the crate root re-exports, by name, with the module that defines each.
fn root_reexports(src: &Path, modules: &BTreeSet<Vec<String>>) -> BTreeMap<String, Vec<String>> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .find(|path| path.exists());
    let Some(root) = root else {
        return BTreeMap::new();
    };
    let code = code_only(&std::fs::read_to_string(root).unwrap());
    let mut reexports = BTreeMap::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(used) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        for path in paths_of_length(used, 2) {
            let path: Vec<String> = path
                .into_iter()
                .skip_while(|p| p == "crate" || p == "self")
                .collect();
            let mut module = Vec::new();
            for part in &path[..path.len().saturating_sub(1)] {
                module.push(part.clone());
                if !modules.contains(&module) {
                    module.pop();
                    break;
                }
            }
            if !module.is_empty() {
                reexports.insert(path.last().unwrap().clone(), module);
            }
        }
    }
    reexports
}

/// Each module (file) of a crate and the modules it names.
fn file_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = sources(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let reexports = root_reexports(src, &modules);
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let mut edges = BTreeSet::new();
        for path in paths(&code) {
            let (mut base, rest): (Vec<String>, &[String]) = match path[0].as_str() {
                "crate" => (Vec::new(), &path[1..]),
                "self" => (module.clone(), &path[1..]),
                "super" => {
                    let mut base = module.clone();
                    let mut rest = &path[..];
                    while rest.first().is_some_and(|p| p == "super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    (base, rest)
                }
                name if children.contains(name) => (module.clone(), &path[..]),
                _ => continue,
            };
            // The longest module the path names; an item the root re-exports, where it
            // is defined.
            let mut target = base.clone();
            for part in rest {
                base.push(part.clone());
                if modules.contains(&base) {
                    target = base.clone();
                } else {
                    if target.is_empty() {
                        if let Some(defined) = reexports.get(part) {
                            target = defined.clone();
                        }
                    }
                    break;
                }
            }
            if target != module {
                edges.insert(target);
            }
        }
        graph.insert(module, edges);
    }
    graph
}

/// The strongly connected components of `graph` (Tarjan's algorithm).
fn components(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a Vec<String>) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        for next in state.graph.get(node).into_iter().flatten() {
            let Some((next, _)) = state.graph.get_key_value(next) else {
                continue;
            };
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            loop {
                let member = state.stack.pop().unwrap();
                state.on_stack.remove(member);
                component.push(member.clone());
                if member == node {
                    break;
                }
            }
            state.found.push(component);
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

#[test]
fn no_circle_of_imports_is_longer_than_two_modules() {
    let mut too_long = Vec::new();
    for krate in CRATES {
        let graph = import_graph(&workspace().join(krate).join("src"));
        assert!(
            graph.len() > 1 || *krate == "process-image",
            "{krate}: no modules found"
        );
        for component in components(&graph) {
            if component.len() > 2 {
                let edges: Vec<String> = component
                    .iter()
                    .flat_map(|from| {
                        graph[from]
                            .iter()
                            .filter(|to| component.contains(to))
                            .map(move |to| format!("{} -> {}", name(from), name(to)))
                    })
                    .collect();
                too_long.push(format!("{krate}: {}", edges.join(", ")));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "modules importing each other in a circle of more than 2:\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_checker_sees_a_circle() {
    let dir = std::env::temp_dir().join(format!("ct-architecture-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("c")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;\npub use a::A;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "use crate::b::B; // crate::c\npub struct A;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "use crate::c::{d::D, E};\npub struct B;\n",
    )
    .unwrap();
    std::fs::write(src.join("c/mod.rs"), "mod d;\npub struct E(crate::A);\n").unwrap();
    std::fs::write(
        src.join("c/d.rs"),
        "pub struct D; const S: &str = \"crate::a\";\n",
    )
    .unwrap();
    let files = file_graph(&src);
    let graph = import_graph(&src);
    let _ = std::fs::remove_dir_all(&dir);
    let module = |path: &[&str]| path.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    assert_eq!(files[&module(&["a"])], BTreeSet::from([module(&["b"])]));
    assert_eq!(
        files[&module(&["b"])],
        BTreeSet::from([module(&["c"]), module(&["c", "d"])])
    );
    assert!(
        files[&module(&["c", "d"])].is_empty(),
        "strings are no imports"
    );
    assert_eq!(graph[&module(&["c"])], BTreeSet::from([module(&["a"])]));
    let longest = components(&graph).into_iter().map(|c| c.len()).max();
    assert_eq!(longest, Some(3), "a -> b -> c -> a");
}

#[test]
fn no_file_of_the_binary_crate_is_over_800_lines() {
    let src = workspace().join("cargo-trace/src");
    let long: Vec<String> = sources(&src)
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (lines > 800).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn the_profile_model_depends_on_no_bpf_crate() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,build",
            "-p",
            "profile",
            "--prefix",
            "none",
        ])
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8(output.stdout).unwrap();
    assert!(tree.lines().count() > 5, "{tree}");
    for crate_name in ["libbpf", "bpf-prog", "probes"] {
        assert!(
            !tree.lines().any(|line| line.starts_with(crate_name)),
            "profile depends on {crate_name}:\n{tree}"
        );
    }
}
