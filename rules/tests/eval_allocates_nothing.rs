//! Evaluation allocates nothing: a counting global allocator (this test binary's own) counts
//! the allocations made on this thread while programs using every instruction evaluate over
//! states with every kind of value, unset ones included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rules::{Schema, State, Type, Value, compile};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether allocations on this thread are counted (other test threads are left out).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only an
// atomic and a const-initialized thread-local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs.
fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn evaluation_allocates_nothing() {
    let mut schema = Schema::new();
    let slots = [
        schema.define("a", Type::Bool),
        schema.define("b", Type::Bool),
        schema.define("x", Type::Number),
        schema.define("s", Type::String),
        schema.define("pool.dc1.healthy_ratio", Type::Number),
    ]
    .map(|s| s.expect("valid name"));
    let sources = [
        "(NOT a OR NOT b) AND a AND NOT b",
        "a && x >= 0.5 || s == \"dc1\" || s != \"a longer string than any inline buffer\"",
        "s in [\"dc1\", \"dc2\", \"dc3\"] AND x in [1, 2, pool.dc1.healthy_ratio]",
        "(a AND b) == (NOT a OR x < 2) AND ((a OR b) != (s == \"z\")) == true",
        "(a OR b) in [a, true] AND NOT pool.dc1.healthy_ratio <= x",
        "TRUE AND !false AND 1 < 2 AND \"a\" != \"b\"",
    ];
    let rules: Vec<_> = sources
        .iter()
        .map(|src| compile(src, &schema).unwrap_or_else(|e| panic!("{src}: {e}")))
        .collect();

    let values: [[Value; 5]; 3] = [
        [
            Value::Unset,
            Value::Unset,
            Value::Unset,
            Value::Unset,
            Value::Unset,
        ],
        [
            true.into(),
            false.into(),
            1.0.into(),
            "dc1".into(),
            0.5.into(),
        ],
        [
            false.into(),
            true.into(),
            f64::NAN.into(),
            "a longer string than any inline buffer".into(),
            2.0.into(),
        ],
    ];
    let states: Vec<State> = values
        .iter()
        .map(|vs| {
            let mut state = State::for_schema(&schema);
            for (slot, v) in slots.iter().zip(vs) {
                state.set(*slot, v.clone());
            }
            state
        })
        .collect();

    let mut trues = 0usize;
    let n = allocations_in(|| {
        for _ in 0..100 {
            for state in &states {
                for rule in &rules {
                    trues += usize::from(rule.eval(state));
                    let _ = std::hint::black_box(rule.reads());
                }
            }
        }
    });
    assert_eq!(n, 0, "evaluation allocated {n} times");
    assert!(trues > 0);

    // The counter works: compiling does allocate.
    assert!(allocations_in(|| drop(compile("a AND b", &schema))) > 0);
}
