//! Code GCC links into every executable without CFI (`crtbegin.o`'s functions) gets rows
//! read from its instructions: a walk from a library's destructors (run by its
//! `__do_global_dtors_aux` through `__cxa_finalize`) goes on to the caller.

use object::{Object, ObjectSymbol, SymbolKind};
use unwind_tables::{compile_file, Cfa, RbpRule, Rule};

#[test]
fn crtbegin_functions_of_a_c_fixture_have_rows() {
    let binary = cargo_trace_tests::fixtures::c_fixture("levels");
    let data = std::fs::read(&binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut functions: Vec<(u64, String)> = file
        .symbols()
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.address() != 0)
        .map(|symbol| (symbol.address(), symbol.name().unwrap_or("").to_string()))
        .collect();
    functions.sort();
    let range_of = |name: &str| {
        let at = functions
            .iter()
            .position(|(_, function)| function == name)
            .unwrap_or_else(|| panic!("{name} in {}", binary.display()));
        functions[at].0..functions[at + 1].0
    };
    let table = compile_file(&binary).unwrap().table;

    let dtors = range_of("__do_global_dtors_aux");
    let rules: Vec<Rule> = dtors.clone().map(|pc| table.lookup(pc)).collect();
    assert!(
        rules.iter().all(|rule| matches!(rule, Rule::Frame { .. })),
        "__do_global_dtors_aux at {dtors:x?}: {rules:?}"
    );
    // Its calls are made with the frame pointer set up.
    assert!(rules.contains(&Rule::Frame {
        cfa: Cfa::Rbp(16),
        rbp: RbpRule::AtCfa(-16)
    }));
    for name in ["deregister_tm_clones", "register_tm_clones", "frame_dummy"] {
        for pc in range_of(name) {
            assert!(
                matches!(table.lookup(pc), Rule::Frame { .. }),
                "{name} at {pc:#x}: {:?}",
                table.lookup(pc)
            );
        }
    }
}
