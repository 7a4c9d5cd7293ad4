//! The heap fixtures' sites as a run counted them: the CSV output's rows, and the check
//! that every site is exact.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::BTreeMap;

use cargo_trace_tests::expected::{self, HeapSite};

use crate::common::{csv_fields, Run};

/// One CSV row of `--csv`: its stack's frames (root first) and values by column name.
#[derive(Clone)]
pub struct Row {
    pub probe: String,
    pub pid: u32,
    pub frames: Vec<String>,
    pub truncated: String,
    pub values: BTreeMap<String, i64>,
}

impl Row {
    pub fn value(&self, name: &str) -> i64 {
        *self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("no column {name}"))
    }
}

/// The rows of the CSV file `name` a run wrote.
pub fn read_csv(run: &Run, name: &str) -> Vec<Row> {
    let path = run.scratch.path(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no CSV {}: {e}\n{}", path.display(), run.stderr));
    let mut lines = text.lines();
    let header = csv_fields(lines.next().expect("a header"));
    lines
        .map(|line| {
            let fields = csv_fields(line);
            assert_eq!(fields.len(), header.len(), "{line}");
            let values = header[4..]
                .iter()
                .zip(&fields[4..])
                .map(|(name, value)| (name.clone(), value.parse().unwrap()))
                .collect();
            Row {
                probe: fields[0].clone(),
                pid: fields[1].parse().unwrap(),
                truncated: fields[2].clone(),
                frames: fields[3].split(';').map(str::to_string).collect(),
                values,
            }
        })
        .collect()
}

/// The rows of a site: stacks through its function.
pub fn rows_of<'a>(rows: &'a [Row], site: &HeapSite) -> Vec<&'a Row> {
    rows.iter()
        .filter(|row| row.frames.contains(&site.function))
        .collect()
}

pub fn sum(rows: &[&Row], column: &str) -> i64 {
    rows.iter().map(|row| row.value(column)).sum()
}

/// Every site's allocations, bytes, frees and leaks exactly as the fixture counted them,
/// each in its size's histogram bucket, and every walk complete.
pub fn check_sites(run: &Run, rows: &[Row]) -> Vec<HeapSite> {
    assert!(run.status.success(), "cargo-trace failed: {}", run.stderr);
    run.assert_every_walk_complete();
    let sites = expected::parse_heap_sites(&run.stdout).unwrap();
    assert!(!sites.is_empty(), "no heap lines in {}", run.stdout);
    for site in &sites {
        let rows = rows_of(rows, site);
        let name = &site.function;
        assert_eq!(
            sum(&rows, "allocs") as u64,
            site.allocs,
            "{name} allocations"
        );
        assert_eq!(sum(&rows, "alloc_space") as u64, site.bytes, "{name} bytes");
        assert_eq!(sum(&rows, "frees") as u64, site.frees, "{name} frees");
        assert_eq!(
            sum(&rows, "leaked_blocks") as u64,
            site.leaked,
            "{name} leaks"
        );
        if let Some(bucket) = site.size_bucket() {
            assert_eq!(
                sum(&rows, &format!("size_bucket_{bucket}")) as u64,
                site.allocs,
                "{name}: every block in bucket {bucket}"
            );
            assert_eq!(
                sum(&rows, "leaked_bytes") as u64,
                site.leaked * site.size,
                "{name} leaked bytes"
            );
        }
        assert!(rows.iter().all(|row| row.truncated.is_empty()), "{name}");
    }
    sites
}
