//! Agent error formatting.

use super::*;
use crate::config::{ConfigError, Problem};

#[test]
fn a_config_error_prints_each_problem_once_through_the_error_chain() {
    let problem = Problem {
        file: "20-broken.yaml".into(),
        line: Some(7),
        column: Some(17),
        path: "services[0].to.pool".into(),
        message: "unknown pool \"wbe\"".into(),
        hint: None,
    };
    let e = AgentError::from(ConfigError {
        problems: vec![problem],
    });
    // What `switchyard attach` prints (main.rs formats the anyhow chain with `{:#}`).
    let shown = format!("{:#}", anyhow::Error::from(e));
    assert_eq!(
        shown,
        "20-broken.yaml:7 services[0].to.pool: unknown pool \"wbe\""
    );
}
