//! Any bytes through the unwind-table compiler: an error is fine, a panic (or a table that
//! breaks the layout's invariants) is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(object) = unwind_tables::compile(data) {
        let table = &object.table;
        if let Err(invalid) = table.check() {
            panic!("compiled table breaks an invariant: {invalid}");
        }
        // Lookups the walker would do, around every row start.
        for index in 0..table.rows.len().min(4096) {
            let address = table.row_address(index);
            for pc in [address.wrapping_sub(1), address, address.wrapping_add(1)] {
                let _ = table.lookup(pc);
            }
        }
        assert_eq!(object.stats.rows, table.rows.len() as u64);
    }
});
