//! The bundled example `scripts/demo.sh` profiles: a small program whose time
//! splits over a known call tree, built (like most release Rust code) without
//! frame pointers, so only a DWARF-based unwinder sees its stacks.

use std::hint::black_box;

#[inline(never)]
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[inline(never)]
fn parse_records(input: &[u8]) -> usize {
    input
        .split(|&b| b == b'\n')
        .filter(|line| line.len() > 3)
        .count()
}

#[inline(never)]
fn render(n: usize) -> String {
    (0..n).map(|i| format!("record {i}\n")).collect()
}

#[inline(never)]
fn sort_heavy(values: &mut [u64]) {
    values.sort_unstable_by_key(|v| v.rotate_left(17) ^ 0x5555);
}

#[inline(never)]
fn pipeline(round: u64) -> u64 {
    let text = render(2_000);
    let records = parse_records(text.as_bytes()) as u64;
    let mut values: Vec<u64> = (0..20_000u64).map(|i| i.wrapping_mul(round | 1)).collect();
    sort_heavy(&mut values);
    records + checksum(text.as_bytes()) + values[values.len() / 2]
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(2.0);
    let start = std::time::Instant::now();
    let mut total = 0u64;
    let mut round = 0;
    while start.elapsed().as_secs_f64() < seconds {
        total = total.wrapping_add(pipeline(black_box(round)));
        round += 1;
    }
    println!("demo: {round} rounds, checksum {total:#x}");
}
