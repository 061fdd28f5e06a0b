//! The expression language end to end: every operator and precedence level, the expressions of
//! the reference configuration, unset values, type errors, unknown names, error positions.

use rules::{Compiled, ErrorKind, Schema, Slot, State, Type, Value, compile, syntax};

/// `a`, `b`, `c` (bool), `x`, `y` (number), `s` (string), `u` (bool, left unset).
fn schema() -> Schema {
    let mut s = Schema::new();
    for (name, ty) in [
        ("a", Type::Bool),
        ("b", Type::Bool),
        ("c", Type::Bool),
        ("x", Type::Number),
        ("y", Type::Number),
        ("s", Type::String),
        ("u", Type::Bool),
        ("un", Type::Number),
        ("us", Type::String),
    ] {
        s.define(name, ty).expect("valid name");
    }
    s
}

fn slot(schema: &Schema, name: &str) -> Slot {
    schema.get(name).map(|(s, _)| s).expect("defined")
}

/// Evaluates `src` with a, b, c, x, y, s set from the arguments; u, un, us unset.
#[expect(
    clippy::many_single_char_names,
    reason = "the parameters are named after the variables the test expressions read"
)]
fn eval_with(src: &str, a: bool, b: bool, c: bool, x: f64, y: f64, s: &str) -> bool {
    let schema = schema();
    let rule = compile(src, &schema).unwrap_or_else(|e| panic!("{src}: {e}"));
    let mut state = State::for_schema(&schema);
    state.set(slot(&schema, "a"), a);
    state.set(slot(&schema, "b"), b);
    state.set(slot(&schema, "c"), c);
    state.set(slot(&schema, "x"), x);
    state.set(slot(&schema, "y"), y);
    state.set(slot(&schema, "s"), s);
    rule.eval(&state)
}

fn eval(src: &str) -> bool {
    eval_with(src, true, false, true, 2.0, 0.5, "dc1")
}

fn tree(src: &str) -> String {
    syntax::parse(src).map_or_else(|e| format!("error: {e}"), |e| e.to_string())
}

/// `MESSAGE at LINE:COL`, or what it compiled to.
fn error(src: &str) -> String {
    compile(src, &schema()).map_or_else(
        |e| format!("{} at {}:{}", e.message(), e.line(), e.column()),
        |c| format!("compiled {}", c.source()),
    )
}

#[test]
fn literals_in_both_cases() {
    assert!(eval("true") && eval("TRUE"));
    assert!(!eval("false") && !eval("FALSE"));
    assert!(eval("1 == 1.0") && eval("-0.5 < 0") && eval("\"a\\\"b\" == \"a\\\"b\""));
}

#[test]
fn not_in_every_spelling() {
    for spelling in ["NOT", "not", "!"] {
        assert!(!eval(&format!("{spelling} a")), "{spelling}");
        assert!(eval(&format!("{spelling} b")), "{spelling}");
    }
    assert!(eval("NOT NOT a") && eval("!!a") && eval("not ! NOT b"));
}

#[test]
fn and_in_every_spelling_has_its_truth_table() {
    for spelling in ["AND", "and", "&&"] {
        for (a, b) in [(false, false), (false, true), (true, false), (true, true)] {
            let src = format!("a {spelling} b");
            assert_eq!(eval_with(&src, a, b, false, 0.0, 0.0, ""), a && b, "{src}");
        }
    }
}

#[test]
fn or_in_every_spelling_has_its_truth_table() {
    for spelling in ["OR", "or", "||"] {
        for (a, b) in [(false, false), (false, true), (true, false), (true, true)] {
            let src = format!("a {spelling} b");
            assert_eq!(eval_with(&src, a, b, false, 0.0, 0.0, ""), a || b, "{src}");
        }
    }
}

#[test]
fn equality_on_bools_numbers_and_strings() {
    assert!(eval("a == true") && eval("a != b") && eval("b == false") && !eval("a == b"));
    assert!(eval("x == 2") && eval("x != 3") && !eval("x == y") && eval("2 == x"));
    assert!(eval("s == \"dc1\"") && eval("s != \"dc2\"") && !eval("s == \"DC1\""));
}

#[test]
fn ordering_on_numbers_at_and_around_the_boundary() {
    // x = 2
    let cases = [
        ("x < 3", true),
        ("x < 2", false),
        ("x <= 2", true),
        ("x <= 1.5", false),
        ("x > 1", true),
        ("x > 2", false),
        ("x >= 2", true),
        ("x >= 2.5", false),
        ("y < x", true),
        ("-1 > -2", true),
    ];
    for (src, want) in cases {
        assert_eq!(eval(src), want, "{src}");
    }
}

#[test]
fn in_matches_any_item_of_the_list() {
    assert!(eval("x in [1, 2, 3]") && !eval("x in [1, 3]") && eval("x IN [y, 2]"));
    assert!(eval("s in [\"dc2\", \"dc1\"]") && !eval("s in [\"dc2\"]"));
    assert!(eval("a in [false, true]") && !eval("b in [a]") && eval("b in [c, a, false]"));
    assert!(eval("(a AND c) in [true]") && eval("NOT x in [5]"));
}

#[test]
fn parentheses_override_precedence() {
    // a = true, b = false, c = true
    assert!(eval("a OR b AND b"));
    assert!(!eval("(a OR b) AND b"));
    assert!(!eval("NOT (a OR b)"));
    assert!(eval("(((a)))"));
    assert_eq!(tree("(a OR b) AND c"), "((a OR b) AND c)");
}

#[test]
fn precedence_comparison_then_not_then_and_then_or() {
    assert_eq!(tree("NOT x == 1"), "(NOT (x == 1))");
    assert_eq!(tree("NOT a AND b"), "((NOT a) AND b)");
    assert_eq!(tree("NOT a OR b"), "((NOT a) OR b)");
    assert_eq!(tree("a OR b AND c"), "(a OR (b AND c))");
    assert_eq!(tree("a AND b OR c"), "((a AND b) OR c)");
    assert_eq!(
        tree("x < 1 AND y >= 2 OR NOT s in [\"q\"]"),
        "(((x < 1) AND (y >= 2)) OR (NOT (s in [\"q\"])))"
    );
    assert_eq!(tree("a || b && !c == d"), "(a OR (b AND (NOT (c == d))))");
    // Evaluated, not just parsed: NOT binds looser than ==, tighter than AND.
    assert!(eval("NOT x == 1")); // NOT (2 == 1)
    assert!(!eval("NOT a AND a")); // (NOT a) AND a
    assert!(eval("NOT b OR b")); // (NOT b) OR b
}

#[test]
fn and_and_or_chains_are_one_node_unless_parenthesized() {
    assert_eq!(tree("a AND b AND c"), "(a AND b AND c)");
    assert_eq!(tree("a OR b || c or a"), "(a OR b OR c OR a)");
    assert_eq!(tree("(a AND b) AND c"), "((a AND b) AND c)");
    assert_eq!(tree("a AND b OR c AND a"), "((a AND b) OR (c AND a))");
}

#[test]
fn hostile_inputs_are_rejected_or_handled_on_a_small_stack() {
    let big = 50_000;
    let inputs = [
        vec!["a"; big].join(" AND "),
        format!("{}a{}", "(".repeat(big), ")".repeat(big)),
        format!("{}a", "NOT ".repeat(big)),
        format!("x in [{}]", vec!["1"; big].join(", ")),
        // The deepest tree the limits allow: 32 levels of 4 NOTs and a parenthesis each.
        format!("{}a{}", "NOT NOT NOT NOT (".repeat(32), ")".repeat(32)),
    ];
    // 2 MiB: the default stack of a spawned thread and of a tokio worker. The deepest allowed
    // tree needs about half of it in a debug build.
    let results = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            inputs
                .iter()
                .map(|src| compile(src, &schema()).map(|c| c.eval(&State::new(9))).ok())
                .collect::<Vec<_>>()
        })
        .expect("thread")
        .join()
        .expect("no stack overflow");
    assert_eq!(results, [Some(false), None, None, Some(false), Some(false)]);
}

#[test]
fn seed_rule_evaluates_over_its_four_variables() {
    let src = "(NOT dc1_api_healthy OR NOT dc1_db_healthy) AND dc2_api_healthy AND dc2_db_healthy";
    let mut schema = Schema::new();
    let names = [
        "dc1_api_healthy",
        "dc1_db_healthy",
        "dc2_api_healthy",
        "dc2_db_healthy",
    ];
    let slots: Vec<Slot> = names
        .iter()
        .map(|n| schema.define(n, Type::Bool).expect("valid name"))
        .collect();
    let rule = compile(src, &schema).expect("compiles");
    assert_eq!(rule.reads(), slots.as_slice());
    let mut state = State::for_schema(&schema);
    for bits in 0u8..16 {
        let v: Vec<bool> = (0..4).map(|i| bits & (1 << i) != 0).collect();
        for (s, b) in slots.iter().zip(&v) {
            state.set(*s, *b);
        }
        let want = (!v[0] || !v[1]) && v[2] && v[3];
        assert_eq!(rule.eval(&state), want, "{v:?}");
    }
}

/// The schema the agent would build for `reference.yaml`: its state variables and the
/// built-ins its expressions use.
fn reference_schema() -> Schema {
    let mut s = Schema::new();
    let bools = [
        "dc1_api_healthy",
        "dc1_db_healthy",
        "dc2_ready",
        "dc1_capacity_ok",
        "maintenance_mode",
        "canary_release_active",
        "automation_enabled",
        "web_flood",
        "pool.dc1.healthy",
        "pool.dc1-canary.healthy",
        "backend.198.18.1.11.healthy",
        "target.healthy",
    ];
    let numbers = [
        "pool.dc1.healthy_count",
        "pool.dc1.healthy_ratio",
        "pool.dc2.healthy_count",
        "pool.dc2.healthy_ratio",
        "backend.198.18.1.11.rtt_p99_ms",
        "service.web.packets_per_second",
        "target.healthy_count",
    ];
    for n in bools {
        s.define(n, Type::Bool).expect("valid name");
    }
    for n in numbers {
        s.define(n, Type::Number).expect("valid name");
    }
    s
}

const REFERENCE: [&str; 7] = [
    "pool.dc2.healthy_count >= 1",
    "pool.dc1.healthy_ratio >= 0.5",
    "dc1_api_healthy AND dc1_db_healthy AND dc1_capacity_ok AND canary_release_active",
    "dc1_api_healthy AND dc1_db_healthy AND dc1_capacity_ok AND NOT maintenance_mode",
    "(NOT dc1_api_healthy OR NOT dc1_db_healthy OR NOT dc1_capacity_ok OR maintenance_mode) AND dc2_ready",
    "target.healthy_count >= 1",
    "automation_enabled",
];

#[test]
fn reference_expressions_compile_and_decide() {
    let schema = reference_schema();
    let rules: Vec<Compiled> = REFERENCE
        .iter()
        .map(|src| compile(src, &schema).unwrap_or_else(|e| panic!("{src}: {e}")))
        .collect();
    let mut state = State::for_schema(&schema);
    let set = |state: &mut State, name: &str, v: Value| state.set(slot(&schema, name), v);
    for n in [
        "dc1_api_healthy",
        "dc1_db_healthy",
        "dc1_capacity_ok",
        "dc2_ready",
    ] {
        set(&mut state, n, true.into());
    }
    set(&mut state, "maintenance_mode", false.into());
    set(&mut state, "canary_release_active", false.into());
    set(&mut state, "pool.dc2.healthy_count", 2.0.into());
    set(&mut state, "pool.dc1.healthy_ratio", 0.5.into());
    let results = |state: &State| rules.iter().map(|r| r.eval(state)).collect::<Vec<_>>();
    // target.healthy_count and automation_enabled unset: comparisons false, bare name false.
    assert_eq!(
        results(&state),
        [true, true, false, true, false, false, false]
    );
    set(&mut state, "dc1_db_healthy", false.into());
    set(&mut state, "target.healthy_count", 1.0.into());
    set(&mut state, "automation_enabled", true.into());
    assert_eq!(
        results(&state),
        [true, true, false, false, true, true, true]
    );
    set(&mut state, "pool.dc1.healthy_ratio", 0.25.into());
    assert!(!rules[1].eval(&state));
    assert!(
        compile(
            "backend.198.18.1.11.rtt_p99_ms < 20 AND pool.dc1-canary.healthy",
            &schema
        )
        .is_ok()
    );
    assert!(compile("service.web.packets_per_second > 500000", &schema).is_ok());
}

/// Every `when:`, `expr:`, `require:` and `automatic:` in the agent's copy of reference.yaml
/// compiles against the reference schema, so a new expression there is covered here.
#[test]
fn every_expression_in_the_reference_fixture_compiles() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../router-userspace/tests/fixtures/reference/reference.yaml"
    );
    let text = std::fs::read_to_string(path).expect("fixture readable");
    let schema = reference_schema();
    let mut found = 0;
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or_default();
        let src = if let Some(rest) = line.split("when: ").nth(1) {
            rest.trim()
        } else if let Some(rest) = line.split("automatic: ").nth(1) {
            rest.trim()
        } else if let Some(rest) = ["expr: \"", "require: \""]
            .iter()
            .find_map(|key| line.split(key).nth(1))
        {
            rest.split('"').next().unwrap_or_default()
        } else {
            continue;
        };
        found += 1;
        if let Err(e) = compile(src, &schema) {
            panic!("{src}: {e}");
        }
    }
    assert_eq!(found, REFERENCE.len());
}

#[test]
fn unset_values_make_every_comparison_false() {
    // u (bool), un (number), us (string) are unset.
    for src in [
        "u",
        "u == true",
        "u == false",
        "u != true",
        "un == 1",
        "un != 1",
        "un < 1",
        "un <= 1",
        "un > 1",
        "un >= 1",
        "us == \"x\"",
        "us != \"x\"",
        "un in [1, 2]",
        "x in [un]",
        "un == un",
        "us in [us]",
        "u AND true",
    ] {
        assert!(!eval(src), "{src} should be false");
    }
    // NOT is plain negation of the result: a bare unset reads as false, so NOT of it is true.
    for src in [
        "NOT u",
        "NOT un == 1",
        "NOT (un != 1)",
        "u OR true",
        "NOT u AND a",
        "x in [un, 2]",
    ] {
        assert!(eval(src), "{src} should be true");
    }
}

#[test]
fn nan_and_mistyped_values_read_as_unset() {
    let schema = schema();
    let mut state = State::for_schema(&schema);
    state.set(slot(&schema, "x"), f64::NAN);
    state.set(slot(&schema, "a"), 1.0); // the caller's mistake: a is bool
    for src in ["x != 1", "x == x", "a", "a == true", "a != true"] {
        let rule = compile(src, &schema).expect("compiles");
        assert!(!rule.eval(&state), "{src}");
    }
    // A state shorter than the schema: the missing slots are unset.
    let rule = compile("NOT a AND x != 1 OR b", &schema).expect("compiles");
    assert!(!rule.eval(&State::new(0)));
}

#[test]
fn set_reports_only_real_changes() {
    let mut state = State::new(1);
    let s = Slot::new(0);
    assert!(state.set(s, true));
    assert!(!state.set(s, true));
    assert!(state.set(s, Value::Unset));
    assert!(!state.set(Slot::new(9), Value::Unset));
    assert!(state.set(Slot::new(9), "x"));
    assert_eq!(state.len(), 10);
    assert_eq!(state.get(Slot::new(9)), &Value::from("x"));
}

#[test]
fn type_errors_point_at_the_offending_part() {
    let cases = [
        ("a AND 3", "AND needs bool operands, found number at 1:7"),
        ("x OR a", "OR needs bool operands, found number at 1:1"),
        ("NOT s", "NOT needs bool operands, found string at 1:5"),
        ("\"x\" < 2", "'<' compares numbers, found string at 1:5"),
        ("s >= \"a\"", "'>=' compares numbers, found string at 1:3"),
        ("true > false", "'>' compares numbers, found bool at 1:6"),
        ("a == 1", "cannot compare bool with number at 1:3"),
        ("s != x", "cannot compare string with number at 1:3"),
        (
            "x in [1, \"2\"]",
            "cannot compare number with string at 1:10",
        ),
        (
            "x",
            "an expression must be bool (true or false), found number at 1:1",
        ),
        (
            "\"on\"",
            "an expression must be bool (true or false), found string at 1:1",
        ),
        (
            "(1)",
            "an expression must be bool (true or false), found number at 1:1",
        ),
    ];
    for (src, want) in cases {
        assert_eq!(error(src), want, "{src}");
    }
}

#[test]
fn unknown_names_suggest_the_nearest_known_name() {
    let schema = reference_schema();
    let e = compile(
        "dc1_api_healthy AND\n  pool.dc1.healthy_ration >= 0.5",
        &schema,
    )
    .expect_err("unknown name");
    assert_eq!(
        e.kind(),
        &ErrorKind::UnknownName {
            name: "pool.dc1.healthy_ration".into(),
            suggestion: Some("pool.dc1.healthy_ratio".into()),
        }
    );
    assert_eq!(
        e.to_string(),
        "unknown name \"pool.dc1.healthy_ration\"; did you mean \"pool.dc1.healthy_ratio\"? at 2:3\n\
         \x20   pool.dc1.healthy_ration >= 0.5\n\
         \x20   ^^^^^^^^^^^^^^^^^^^^^^^"
    );
    assert_eq!(
        error("maintenance"),
        "unknown name \"maintenance\" at 1:1",
        "nothing close in the small schema"
    );
    let e = compile("NOT maintenance_mod", &schema)
        .err()
        .map(|e| e.message());
    assert_eq!(
        e.as_deref(),
        Some("unknown name \"maintenance_mod\"; did you mean \"maintenance_mode\"?")
    );
}

#[test]
fn syntax_errors_give_line_column_and_caret() {
    let e = compile("(a == true OR b c", &schema()).expect_err("error");
    assert_eq!(
        e.to_string(),
        "expected a comparison, in, AND, OR or ')', found name \"c\" at 1:17\n  \
         (a == true OR b c\n                  ^"
    );
    let e = compile("(a == true OR x > 1 c)", &schema()).expect_err("error");
    assert_eq!(
        (e.message(), e.line(), e.column()),
        ("expected AND, OR or ')', found name \"c\"".into(), 1, 21)
    );
}

#[test]
fn multi_line_expressions_parse_and_report_the_right_line() {
    let src = "a\n  AND (b\n    OR c)\n  AND x >= 1";
    assert!(eval(src));
    let cases = [
        (
            "a\n  AND (b\n    OR)",
            "expected an expression, found ')' at 3:7",
        ),
        (
            "a AND\n\n  b c",
            "expected a comparison, in, AND, OR or end of input, found name \"c\" at 3:5",
        ),
        (
            "a AND\n  (b",
            "expected a comparison, in, AND, OR or ')', found end of input at 2:5",
        ),
        ("a AND\n  x >\t@", "unexpected character '@' at 2:7"),
        ("a\r\n  AND q", "unknown name \"q\" at 2:7"),
    ];
    for (src, want) in cases {
        assert_eq!(error(src), want, "{src:?}");
    }
}

#[test]
fn more_syntax_errors() {
    let cases = [
        ("", "expected an expression, found end of input at 1:1"),
        ("a AND AND b", "expected an expression, found AND at 1:7"),
        (
            "NOT",
            "expected an operand or NOT, found end of input at 1:4",
        ),
        ("a ==", "expected an operand, found end of input at 1:5"),
        (
            "a == b == c",
            "expected AND, OR or end of input, found '==' at 1:8",
        ),
        ("x in 1", "expected '[', found number 1 at 1:6"),
        (
            "x in [1,",
            "expected a name or literal, found end of input at 1:9",
        ),
        ("x in [(y)]", "expected a name or literal, found '(' at 1:7"),
        (
            "a)",
            "expected a comparison, in, AND, OR or end of input, found ')' at 1:2",
        ),
        (
            "a = b",
            "unexpected character '='; use '==' to compare at 1:3",
        ),
        ("a & b", "unexpected character '&'; use '&&' or AND at 1:3"),
        (
            "s == \"open",
            "unterminated string: missing the closing '\"' at 1:6",
        ),
        (
            "pool..x",
            "name \"pool..x\" has an empty segment (two dots in a row, or a dot at an end) at 1:1",
        ),
    ];
    for (src, want) in cases {
        assert_eq!(error(src), want, "{src:?}");
    }
}

#[test]
fn explain_gives_the_value_of_every_variable_read() {
    let schema = schema();
    let rule = compile("a AND (x >= 1 OR u) AND s in [\"dc1\"] AND a", &schema).expect("compiles");
    let mut state = State::for_schema(&schema);
    state.set(slot(&schema, "a"), true);
    state.set(slot(&schema, "x"), 1.5);
    state.set(slot(&schema, "s"), "dc1");
    let explained = rule.explain(&state);
    assert!(explained.result);
    let names: Vec<(&str, &Value)> = explained.values.iter().map(|r| (r.name, r.value)).collect();
    assert_eq!(
        names,
        [
            ("a", &Value::Bool(true)),
            ("x", &Value::Number(1.5)),
            ("s", &Value::from("dc1")),
            ("u", &Value::Unset),
        ]
    );
    assert_eq!(
        explained.to_string(),
        "true: a = true, x = 1.5, s = \"dc1\", u = unset"
    );
}

#[test]
fn comparisons_of_parenthesized_expressions_use_the_bit_stack() {
    // a = true, b = false, c = true
    assert!(eval("(a AND c) == (b OR c)"));
    assert!(!eval("(a AND b) == (b OR c)"));
    assert!(eval("((a AND b) == (b OR c)) != ((a OR b) == (c AND a))"));
    assert!(eval("(a AND c) == (NOT b) AND (b == (a AND b))"));
    assert!(eval("NOT (b AND c) in [a]")); // NOT ((b AND c) in [a])
    assert!(!eval("NOT (b AND c) in [a, b]"));
}
