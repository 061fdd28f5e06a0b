//! A 1,000-rule group over 200 variables, after one variable changes: evaluating the rules that
//! read it (what the event-driven engine does) and evaluating all 1,000. Target: p50 < 20 µs.
//!
//! `cargo bench -p rules --bench eval`; criterion's median is the p50 reported in
//! `docs/rules.md`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rules::{Compiled, Schema, Slot, State, Type, Value, compile};

const BOOLS: usize = 140;
const NUMBERS: usize = 50;
const STRINGS: usize = 10;
const RULES: usize = 1000;

/// A deterministic generator, so every run benchmarks the same group.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }
}

struct Group {
    state: State,
    rules: Vec<Compiled>,
    /// For every slot, the rules that read it.
    readers: Vec<Vec<usize>>,
    slots: Vec<(Slot, Type)>,
    results: Vec<bool>,
}

fn group() -> Group {
    let mut schema = Schema::new();
    let mut bools = Vec::new();
    let mut numbers = Vec::new();
    let mut strings = Vec::new();
    for i in 0..BOOLS {
        let name = format!("backend.10.0.{}.{}.healthy", i / 50, i % 50);
        schema.define(&name, Type::Bool).expect("valid name");
        bools.push(name);
    }
    for i in 0..NUMBERS {
        let name = format!("pool.p{i}.healthy_ratio");
        schema.define(&name, Type::Number).expect("valid name");
        numbers.push(name);
    }
    for i in 0..STRINGS {
        let name = format!("region{i}.mode");
        schema.define(&name, Type::String).expect("valid name");
        strings.push(name);
    }

    // Rules shaped like failover rules: a few health flags, a capacity threshold, now and then
    // a mode check; 4–6 variables each.
    let mut rng = Lcg(0x5eed);
    let rules: Vec<Compiled> = (0..RULES)
        .map(|i| {
            let mut b = || bools[rng.below(BOOLS)].clone();
            let (b1, b2, b3, b4) = (b(), b(), b(), b());
            let n = &numbers[rng.below(NUMBERS)];
            let src = match i % 4 {
                0 => format!("{b1} AND {b2} AND {n} >= 0.5 AND NOT {b3}"),
                1 => format!("(NOT {b1} OR NOT {b2}) AND {b3} AND {b4}"),
                2 => format!(
                    "{b1} AND ({n} > 0.25 OR {b2}) AND {} in [\"active\", \"standby\"]",
                    strings[rng.below(STRINGS)]
                ),
                _ => format!("{b1} AND {b2} AND {b3} AND {n} >= 0.75 OR {b4}"),
            };
            compile(&src, &schema).unwrap_or_else(|e| panic!("{src}: {e}"))
        })
        .collect();

    let mut readers = vec![Vec::new(); schema.len()];
    for (r, rule) in rules.iter().enumerate() {
        for slot in rule.reads() {
            readers[slot.index()].push(r);
        }
    }
    let slots: Vec<(Slot, Type)> = schema.iter().map(|(_, s, t)| (s, t)).collect();
    let mut state = State::for_schema(&schema);
    for (i, &(slot, ty)) in slots.iter().enumerate() {
        state.set(slot, value(ty, i % 3 != 0));
    }
    Group {
        state,
        results: vec![false; rules.len()],
        rules,
        readers,
        slots,
    }
}

/// The two values a variable flips between.
fn value(ty: Type, on: bool) -> Value {
    match ty {
        Type::Bool => Value::Bool(on),
        Type::Number => Value::Number(if on { 0.8 } else { 0.3 }),
        Type::String => Value::from(if on { "active" } else { "drain" }),
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "an average of counts in the thousands, printed to one decimal"
)]
fn bench(c: &mut Criterion) {
    let mut g = group();
    let reads: usize = g.readers.iter().map(Vec::len).sum();
    println!(
        "group: {} rules, {} variables, {:.1} readers per variable on average (max {})",
        g.rules.len(),
        g.slots.len(),
        reads as f64 / g.slots.len() as f64,
        g.readers.iter().map(Vec::len).max().unwrap_or(0)
    );
    // Both values of every variable, built once; a change clones one (a string change
    // allocates, as it would in the agent).
    let flips: Vec<[Value; 2]> = g
        .slots
        .iter()
        .map(|&(_, t)| [value(t, false), value(t, true)])
        .collect();
    let mut next = 0usize;
    let mut on = false;
    let mut change = |g: &mut Group| -> usize {
        next = (next + 1) % g.slots.len();
        if next == 0 {
            on = !on;
        }
        let (slot, _) = g.slots[next];
        g.state.set(slot, flips[next][usize::from(on)].clone());
        next
    };

    c.bench_function("one_change/eval_readers", |b| {
        b.iter(|| {
            let changed = change(&mut g);
            let Group {
                state,
                rules,
                readers,
                results,
                ..
            } = &mut g;
            for &r in &readers[changed] {
                results[r] = rules[r].eval(state);
            }
            black_box(&results);
        });
    });
    c.bench_function("one_change/eval_all_1000", |b| {
        b.iter(|| {
            change(&mut g);
            let Group {
                state,
                rules,
                results,
                ..
            } = &mut g;
            for (out, rule) in results.iter_mut().zip(rules.iter()) {
                *out = rule.eval(state);
            }
            black_box(&results);
        });
    });
    let seed = &g.rules[1];
    c.bench_function("one_rule/eval", |b| {
        b.iter(|| black_box(seed.eval(&g.state)));
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
