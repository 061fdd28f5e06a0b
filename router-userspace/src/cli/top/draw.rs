//! The screen of `switchyard top`: a header, then services, pools with their backends,
//! decision groups with the last switches beside the drops by reason, and the keys. Only
//! layout here; every value comes from the [`View`].

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table},
};

use super::{Rate, View, human};

/// `pps` and `bps` cells of a rate (`-` before the second sample).
fn rate_cells(r: Option<Rate>) -> [Cell<'static>; 2] {
    match r {
        Some(r) => [Cell::from(human(r.pps)), Cell::from(human(r.bps))],
        None => [Cell::from("-"), Cell::from("-")],
    }
}

fn table<'a>(title: String, header: &[&'a str], rows: Vec<Row<'a>>, widths: &[u16]) -> Table<'a> {
    table_of(
        title,
        header,
        rows,
        widths.iter().map(|w| Constraint::Length(*w)),
    )
}

/// [`table`] with any column constraints.
fn table_of<'a>(
    title: String,
    header: &[&'a str],
    rows: Vec<Row<'a>>,
    widths: impl IntoIterator<Item = Constraint>,
) -> Table<'a> {
    Table::new(rows, widths)
        .header(Row::new(header.to_vec()).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::new().borders(Borders::TOP).title(title))
}

/// Lines a table of `rows` rows takes (its border and header included).
fn height(rows: usize) -> u16 {
    u16::try_from(rows).unwrap_or(u16::MAX).saturating_add(2)
}

/// Draws the view on the whole frame; `base` is the API's URL, for the header.
pub fn draw(f: &mut Frame, view: &View, base: &str) {
    let services = view.services();
    let backends = view.backends();
    let [head, svc, pools, rest, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(height(services.len())),
        Constraint::Length(height(backends.len())),
        Constraint::Min(6),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(header(view, base)), head);
    f.render_widget(services_table(services), svc);
    f.render_widget(pools_table(backends), pools);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(65), Constraint::Percentage(35)]).areas(rest);
    decisions(f, view, left);
    f.render_widget(drops_table(view), right);
    f.render_widget(
        Paragraph::new(Line::from(
            "q quit  s sort  / filter  c clear filter  p pause",
        ))
        .style(Style::new().add_modifier(Modifier::REVERSED)),
        keys,
    );
}

/// The first line: the agent, generation, sort, filter, pause and the last poll's problem.
fn header(view: &View, base: &str) -> String {
    use std::fmt::Write as _;
    let generation = view.current().map_or_else(String::new, |s| {
        format!("generation {}  ", s.status.generation)
    });
    let mut header = format!(
        "switchyard top  {base}  {generation}sort: {}",
        view.sort.name()
    );
    if view.editing || !view.filter.is_empty() {
        let _ = write!(header, "  filter: {}", view.filter);
        if view.editing {
            header.push('_');
        }
    }
    if view.paused {
        header.push_str("  PAUSED");
    }
    if let Some(p) = &view.problem {
        let _ = write!(header, "  poll failed: {p}");
    }
    header
}

fn services_table(services: Vec<super::ServiceRow>) -> Table<'static> {
    let rows = services
        .into_iter()
        .map(|s| {
            let [pps, bps] = rate_cells(s.rate);
            Row::new(vec![
                Cell::from(s.name),
                Cell::from(s.address),
                Cell::from(s.forward),
                Cell::from(s.to),
                pps,
                bps,
            ])
        })
        .collect();
    table(
        "services".into(),
        &["name", "address", "forward", "to", "pps", "bps"],
        rows,
        &[16, 28, 14, 24, 8, 8],
    )
}

fn pools_table(backends: Vec<super::BackendRow>) -> Table<'static> {
    let rows = backends
        .into_iter()
        .map(|b| {
            let [pps, bps] = rate_cells(b.rate);
            let weight = match b.effective_weight {
                Some(e) if e != b.weight => format!("{e}/{}", b.weight),
                _ => b.weight.to_string(),
            };
            let color = if b.up { Color::Green } else { Color::Red };
            Row::new(vec![
                Cell::from(b.pool),
                Cell::from(b.address),
                Cell::from(b.health).style(Style::new().fg(color)),
                Cell::from(weight),
                Cell::from(b.flows.map_or_else(|| "-".into(), |n| n.to_string())),
                pps,
                bps,
            ])
        })
        .collect();
    table(
        "pools".into(),
        &["pool", "backend", "health", "weight", "flows", "pps", "bps"],
        rows,
        &[16, 28, 30, 9, 7, 8, 8],
    )
}

fn drops_table(view: &View) -> Table<'static> {
    let rows: Vec<Row> = view
        .drops()
        .into_iter()
        .map(|d| {
            Row::new(vec![
                d.reason.to_owned(),
                human(u64_f64(d.packets)),
                d.pps.map_or_else(|| "-".into(), human),
            ])
        })
        .collect();
    let title = if rows.is_empty() {
        "drops by reason: none"
    } else {
        "drops by reason"
    };
    table(
        title.into(),
        &["reason", "packets", "pps"],
        rows,
        &[18, 8, 8],
    )
}

/// The decision groups, then the last switches.
fn decisions(f: &mut Frame, view: &View, area: Rect) {
    let groups = view.groups();
    let switches = view.switches();
    let [top, bottom] =
        Layout::vertical([Constraint::Length(height(groups.len())), Constraint::Min(0)])
            .areas(area);
    let rows = groups
        .into_iter()
        .map(|g| {
            Row::new(vec![
                g.name,
                g.active,
                g.by,
                g.for_secs.map_or_else(|| "-".into(), |s| format!("{s}s")),
                g.role.unwrap_or_default(),
            ])
        })
        .collect();
    f.render_widget(
        table(
            "decision groups".into(),
            &["group", "active", "by", "for", "role"],
            rows,
            &[14, 24, 18, 8, 9],
        ),
        top,
    );
    let rows = switches
        .into_iter()
        .map(|(w, ago)| {
            Row::new(vec![
                format!("{ago}s ago"),
                w.group,
                format!("{} → {}", w.from, w.to),
                w.by,
                w.cause,
            ])
        })
        .collect();
    // The switch takes the width the fixed columns leave, twice the cause's share: where the
    // group went is the fact that matters.
    let widths = [
        Constraint::Length(8),
        Constraint::Length(12),
        Constraint::Fill(2),
        Constraint::Length(16),
        Constraint::Fill(1),
    ];
    f.render_widget(
        table_of(
            "last switches".into(),
            &["when", "group", "switch", "by", "cause"],
            rows,
            widths,
        ),
        bottom,
    );
}

#[expect(
    clippy::cast_precision_loss,
    reason = "a count shown with one decimal needs no more than f64's 53 bits"
)]
fn u64_f64(x: u64) -> f64 {
    x as f64
}
