//! Symbol names as people read them.

/// The names of one symbol: as written in the object, and demangled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demangled {
    pub raw: String,
    /// Rust (legacy or v0), without the hash: `myprog::parse`.
    pub rust: Option<String>,
    /// C++, demangled in full: `ns::f(int, char)`.
    pub cpp_full: Option<String>,
    /// C++ without return type and arguments: `ns::f`.
    pub cpp_short: Option<String>,
}

impl Demangled {
    pub fn of(raw: &str) -> Demangled {
        let mut names = Demangled {
            raw: raw.to_string(),
            ..Demangled::default()
        };
        if raw.starts_with("_R") || raw.starts_with("_ZN") {
            if let Ok(demangled) = rustc_demangle::try_demangle(raw) {
                names.rust = Some(format!("{demangled:#}"));
                return names;
            }
        }
        if raw.starts_with("_Z") {
            if let Ok(symbol) = cpp_demangle::Symbol::new(raw.as_bytes()) {
                let options = cpp_demangle::DemangleOptions::new();
                names.cpp_full = symbol.demangle(&options).ok();
                names.cpp_short = symbol.demangle(&options.no_params().no_return_type()).ok();
            }
        }
        names
    }

    /// The name to show: Rust without hash, C++ in full, else the raw name.
    pub fn display(&self) -> &str {
        self.rust
            .as_deref()
            .or(self.cpp_full.as_deref())
            .unwrap_or(&self.raw)
    }
}

/// The name to show for symbol `raw` (see [`Demangled::display`]).
pub fn demangle(raw: &str) -> String {
    Demangled::of(raw).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_without_hash_cpp_in_full_c_unchanged() {
        assert_eq!(
            demangle("_ZN6chains7recurse17h792d3f4d9c013bdeE"),
            "chains::recurse"
        );
        assert_eq!(demangle("_ZN2ns1fEic"), "ns::f(int, char)");
        assert_eq!(
            Demangled::of("_ZN2ns1fEic").cpp_short.as_deref(),
            Some("ns::f")
        );
        assert_eq!(demangle("deep_leaf"), "deep_leaf");
        assert_eq!(demangle("_Znot_valid"), "_Znot_valid");
    }
}
