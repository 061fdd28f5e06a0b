//! Maglev table build time for 10, 100 and 1,000 equal-weight backends at the data plane's table
//! size (`MAGLEV_SIZE`, 65,537 slots), and the weighted worst case: 999 backends of weight 1 and
//! one of 65,535 (the largest configurable weight), where the table fills only after ~64,000
//! credit rounds over all 1,000 backends. Run: `cargo bench -p router-userspace --bench maglev`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use router_common::MAGLEV_SIZE;
use switchyard::maglev::{MaglevBackend, build};

fn backends(n: u32) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| MaglevBackend {
            id: i,
            key: format!("10.0.{}.{}:80", i / 256, i % 256),
            weight: 1,
        })
        .collect()
}

fn build_table(c: &mut Criterion) {
    let mut group = c.benchmark_group("maglev_build");
    for n in [10, 100, 1_000] {
        let input = backends(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
            b.iter(|| build(black_box(input), MAGLEV_SIZE));
        });
    }
    let mut skewed = backends(1_000);
    if let Some(heavy) = skewed.first_mut() {
        heavy.weight = 65_535;
    }
    group.bench_function("1000_skewed", |b| {
        b.iter(|| build(black_box(&skewed), MAGLEV_SIZE));
    });
    group.finish();
}

criterion_group!(benches, build_table);
criterion_main!(benches);
