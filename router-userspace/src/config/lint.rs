//! Lint of a valid configuration's decision groups (`rules::lint`), as warnings for
//! `switchyard validate`: they never make a configuration invalid.

use super::{Config, schema};

/// Warnings about `cfg`'s decision groups, one line each, `decisions[GROUP]: …`; a last line
/// per group says when the lint was partial. Empty when nothing looks wrong.
#[must_use]
pub fn lint(cfg: &Config) -> Vec<String> {
    let Ok(schema) = schema::build(cfg) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for g in &cfg.decisions {
        let rules: Vec<rules::LintRule<'_>> = g
            .rules
            .iter()
            .map(|r| rules::LintRule {
                id: &r.id,
                priority: r.priority,
                when: &r.when,
            })
            .collect();
        let l = rules::lint(&rules, g.default.is_some(), &schema);
        let at = format!("decisions[{}]", g.name);
        out.extend(l.findings.iter().map(|f| format!("{at}: {f}")));
        out.extend(l.partial.iter().map(|p| format!("{at}: lint partial: {p}")));
        if !l.findings.is_empty() {
            out.extend(l.notes.iter().map(|n| format!("{at}: note: {n}")));
        }
    }
    out
}
