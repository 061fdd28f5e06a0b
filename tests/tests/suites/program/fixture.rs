//! The runner of the program's fixture tables: steps run in order against one loaded program
//! (so earlier frames leave conntrack and fragment state for later ones). A step is a row — a
//! frame, the lb interface it arrives on, and the verdict, reason and output it must get — or a
//! change to the maps between rows, or a check over what earlier rows reached.
//!
//! A row's backend can be remembered under a name ([`To::Record`]) and compared by later rows
//! ([`To::Same`], [`To::Other`]), read by later frames ([`On::BackendOf`], [`Frame::Built`]) and
//! by checks ([`Memo`]). Every step runs even after one fails; the error names each failing
//! step.

use std::collections::HashMap;
use std::net::IpAddr;

use anyhow::{Context as _, Result, bail, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{
        LB_CLIENT_IF, backend_mac, backend_v4, backend_v6, lb_backend_if, lb_backend_side_mac,
    },
    lab::Lab,
    packets::inspect,
};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// The verdict a row must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `XDP_DROP`.
    Drop,
    /// `XDP_PASS`.
    Pass,
    /// `XDP_REDIRECT` (out of another interface).
    Redirect,
    /// `XDP_TX` or `XDP_REDIRECT`.
    Forward,
}

impl Verdict {
    fn admits(self, action: u32) -> bool {
        match self {
            Verdict::Drop => action == XDP_DROP,
            Verdict::Pass => action == XDP_PASS,
            Verdict::Redirect => action == XDP_REDIRECT,
            Verdict::Forward => action == XDP_TX || action == XDP_REDIRECT,
        }
    }
}

/// A check of the backend (1-based) a row reached, given what earlier rows remembered.
pub type BackendCheck = Box<dyn Fn(&Memo, usize) -> Result<()>>;

/// Builds a row's frame from what earlier rows remembered.
pub type Builder = Box<dyn Fn(&Memo) -> Result<Vec<u8>>>;

/// A change to the lab between rows, or a check of it; it may remember values.
pub type Change = Box<dyn FnMut(&mut Lab, &mut Memo) -> Result<()>>;

/// Which backend (1-based) a forwarded frame must reach.
pub enum To {
    /// Any backend.
    Any,
    /// Any backend, remembered under this name.
    Record(String),
    /// The backend remembered under this name.
    Same(String),
    /// Any backend but the one remembered under this name.
    Other(String),
    /// This backend.
    Is(usize),
    /// Whatever the closure accepts, given what earlier rows remembered.
    Check(BackendCheck),
}

impl To {
    fn check(&self, memo: &mut Memo, b: usize) -> Result<()> {
        match self {
            To::Any => {}
            To::Record(name) => memo.set(name, b),
            To::Same(name) => {
                let want = memo.get(name)?;
                ensure!(b == want, "reached backend {b}, not {want} ({name})");
            }
            To::Other(name) => {
                let other = memo.get(name)?;
                ensure!(b != other, "reached backend {b}, the one of {name}");
            }
            To::Is(want) => ensure!(b == *want, "reached backend {b}, not {want}"),
            To::Check(f) => f(memo, b)?,
        }
        Ok(())
    }
}

/// What the output frame must look like.
pub enum Out {
    /// Byte-identical to the input.
    Untouched,
    /// Not read.
    Unread,
    /// Forwarded by DSR: to a backend's MAC from the lb's MAC on that link, addresses
    /// unchanged, every checksum verifying (recomputed here).
    Dsr,
    /// Forwarded by NAT: like [`Out::Dsr`], with the destination the backend's address.
    Nat,
    /// Parsed, and addressed to a backend's MAC; nothing else is read.
    Backend,
    /// Only the destination MAC is read, raw, and must be a backend's (for frames the parser
    /// misreads: etherparse 0.16 takes a later IPv6 fragment for UDP).
    Mac,
    /// These fields, each checked when given.
    Fields(Fields),
}

/// Fields of a forwarded frame, read back with [`inspect`].
#[derive(Default)]
pub struct Fields {
    pub dst_mac: Option<[u8; 6]>,
    pub src_mac: Option<[u8; 6]>,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// Whether every checksum must verify.
    pub checksums_ok: bool,
}

/// The lb interface a frame arrives on.
pub enum On {
    /// From the client.
    Client,
    /// From the backend remembered under this name (its reply).
    BackendOf(String),
}

/// A row's input frame.
pub enum Frame {
    Fixed(Vec<u8>),
    /// Built when the row runs, from what earlier rows remembered.
    Built(Builder),
}

/// One frame and what it must get.
pub struct Row {
    name: String,
    on: On,
    frame: Frame,
    verdict: Verdict,
    /// The one reason counter the frame moves, by one; `None`: not checked for this row (a
    /// check step covers it).
    reason: Option<Reason>,
    out: Out,
    to: To,
}

/// A row, or a change or check between rows (given the lab and what rows remembered).
pub enum Step {
    Send(Row),
    Do(String, Change),
}

impl From<Row> for Step {
    fn from(row: Row) -> Self {
        Step::Send(row)
    }
}

/// What earlier steps remembered: backends of rows ([`To::Record`]) and counts taken by
/// steps, by name.
#[derive(Default)]
pub struct Memo(HashMap<String, usize>);

impl Memo {
    /// The value remembered under `name`.
    pub fn get(&self, name: &str) -> Result<usize> {
        self.0
            .get(name)
            .copied()
            .with_context(|| format!("nothing remembered as {name}"))
    }

    /// Remembers `value` under `name`.
    pub fn set(&mut self, name: &str, value: usize) {
        self.0.insert(name.to_owned(), value);
    }

    /// The values remembered under names starting with `prefix`.
    pub fn with_prefix(&self, prefix: &str) -> Vec<usize> {
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .collect()
    }
}

fn row(name: &str, frame: Vec<u8>, verdict: Verdict, reason: Reason, out: Out) -> Row {
    Row {
        name: name.to_owned(),
        on: On::Client,
        frame: Frame::Fixed(frame),
        verdict,
        reason: Some(reason),
        out,
        to: To::Any,
    }
}

/// `frame` is passed untouched, counted under `reason`.
pub fn pass(name: &str, frame: Vec<u8>, reason: Reason) -> Row {
    row(name, frame, Verdict::Pass, reason, Out::Untouched)
}

/// `frame` is dropped, counted under `reason`.
pub fn dropped(name: &str, frame: Vec<u8>, reason: Reason) -> Row {
    row(name, frame, Verdict::Drop, reason, Out::Unread)
}

/// `frame` is forwarded by DSR ([`Out::Dsr`]), counted under `reason`.
pub fn dsr(name: &str, frame: Vec<u8>, reason: Reason) -> Row {
    row(name, frame, Verdict::Forward, reason, Out::Dsr)
}

/// `frame` is forwarded by NAT ([`Out::Nat`]), counted under `reason`.
pub fn nat(name: &str, frame: Vec<u8>, reason: Reason) -> Row {
    row(name, frame, Verdict::Forward, reason, Out::Nat)
}

/// `frame` is forwarded to a backend ([`Out::Backend`]), counted under `reason`.
pub fn forwarded(name: &str, frame: Vec<u8>, reason: Reason) -> Row {
    row(name, frame, Verdict::Forward, reason, Out::Backend)
}

impl Row {
    /// Which backend it must reach.
    pub fn to(mut self, to: To) -> Self {
        self.to = to;
        self
    }

    /// What its output must look like.
    pub fn out(mut self, out: Out) -> Self {
        self.out = out;
        self
    }

    /// Its verdict.
    pub fn verdict(mut self, verdict: Verdict) -> Self {
        self.verdict = verdict;
        self
    }

    /// Its reason is not checked here (a check step covers the counters).
    pub fn any_reason(mut self) -> Self {
        self.reason = None;
        self
    }

    /// The interface it arrives on.
    pub fn on(mut self, on: On) -> Self {
        self.on = on;
        self
    }

    /// Its frame, built when it runs.
    pub fn built(mut self, f: impl Fn(&Memo) -> Result<Vec<u8>> + 'static) -> Self {
        self.frame = Frame::Built(Box::new(f));
        self
    }
}

/// A step that changes the lab (or reads it into the memo).
pub fn step(name: &str, f: impl FnMut(&mut Lab, &mut Memo) -> Result<()> + 'static) -> Step {
    Step::Do(name.to_owned(), Box::new(f))
}

/// A step that checks the lab and the memo.
pub fn check(name: &str, f: impl Fn(&Lab, &Memo) -> Result<()> + 'static) -> Step {
    step(name, move |lab, memo| f(lab, memo))
}

/// Empties connection tracking, so the next packet of every flow is a fresh selection.
pub fn flush() -> Step {
    step("flush conntrack", |lab, _| {
        lab.flush_conntrack();
        Ok(())
    })
}

/// Runs the rows after it on CPU `cpu` (`BPF_PROG_TEST_RUN` runs the program on the caller's
/// CPU, and each CPU has its own flow cache).
pub fn on_cpu(cpu: usize) -> Step {
    step(&format!("on CPU {cpu}"), move |lab, _| {
        lab.set_cpu(cpu);
        Ok(())
    })
}

/// Moves the program's clock forward by `by`.
pub fn advance(by: std::time::Duration) -> Step {
    step(&format!("clock + {by:?}"), move |lab, _| {
        lab.advance_clock(by)
    })
}

/// Records a health verdict for `address` in `pool`.
pub fn health(pool: &'static str, address: IpAddr, healthy: bool) -> Step {
    step(
        &format!("{pool}: {address} healthy={healthy}"),
        move |lab, _| lab.set_health(pool, &address.to_string(), healthy),
    )
}

/// An operator's drain of `address` in `pool` (`ctl backend drain`, or its timeout).
pub fn drain(pool: &'static str, address: IpAddr, drain: switchyard::health::Drain) -> Step {
    step(
        &format!("{pool}: {address} drain {drain:?}"),
        move |lab, _| lab.set_drain(pool, &address.to_string(), drain),
    )
}

/// Remembers the packets counted for `reason` so far under `name`.
pub fn count(name: &'static str, reason: Reason) -> Step {
    step(&format!("count {reason:?} as {name}"), move |lab, memo| {
        memo.set(name, usize::try_from(lab.reason(reason))?);
        Ok(())
    })
}

/// Runs `table` in order on `lab`; fails naming every step that failed.
pub fn run(lab: &mut Lab, table: impl IntoIterator<Item = Step>) -> Result<()> {
    let mut memo = Memo::default();
    let mut failures = Vec::new();
    let mut steps = 0;
    for s in table {
        steps += 1;
        let (name, result) = match s {
            Step::Send(row) => {
                let result = send(lab, &mut memo, &row);
                (row.name, result)
            }
            Step::Do(name, mut f) => {
                let result = f(lab, &mut memo);
                (name, result)
            }
        };
        if let Err(e) = result {
            failures.push(format!("  {name}: {e:#}"));
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {steps} steps failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// Which backend (1-based) of `lab` has the MAC `mac`.
fn backend_by_mac(lab: &Lab, mac: &[u8]) -> Result<usize> {
    (1..=lab.topo.backend_count())
        .find(|i| backend_mac(*i) == mac)
        .with_context(|| format!("destination MAC {mac:02x?} is no backend's"))
}

fn send(lab: &Lab, memo: &mut Memo, row: &Row) -> Result<()> {
    let frame = match &row.frame {
        Frame::Fixed(f) => f.clone(),
        Frame::Built(f) => f(memo)?,
    };
    let iface = match &row.on {
        On::Client => LB_CLIENT_IF.to_owned(),
        On::BackendOf(name) => lb_backend_if(memo.get(name)?),
    };
    let before: Vec<u64> = Reason::ALL.iter().map(|r| lab.reason(*r)).collect();
    let run = lab.run_on(&iface, &frame)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a counter's growth over one run: 0, or 1 for the reason counted"
    )]
    let moved: Vec<Reason> = Reason::ALL
        .iter()
        .zip(&before)
        .flat_map(|(r, b)| std::iter::repeat_n(*r, (lab.reason(*r) - b) as usize))
        .collect();
    ensure!(
        row.verdict.admits(run.action),
        "action {} (want {:?}); counted {moved:?}",
        run.action,
        row.verdict
    );
    if let Some(reason) = row.reason {
        ensure!(
            moved == [reason],
            "counted {moved:?} (want [{reason:?}]); action {}",
            run.action
        );
    }
    let backend = match &row.out {
        Out::Untouched => {
            ensure!(run.out == frame, "the frame was modified");
            None
        }
        Out::Unread => None,
        Out::Mac => Some(backend_by_mac(lab, run.out.get(..6).context("runt")?)?),
        Out::Backend => Some(backend_by_mac(lab, &inspect(&run.out)?.dst_mac)?),
        Out::Dsr | Out::Nat => {
            let before = inspect(&frame)?;
            let seen = inspect(&run.out)?;
            let b = backend_by_mac(lab, &seen.dst_mac)?;
            ensure!(seen.src_mac == lb_backend_side_mac(b), "source MAC");
            ensure!(seen.checksums_ok, "a checksum does not verify: {seen:?}");
            ensure!(seen.src == before.src, "source address changed");
            let want_dst = match (&row.out, before.dst) {
                (Out::Nat, IpAddr::V4(_)) => IpAddr::V4(backend_v4(b)),
                (Out::Nat, IpAddr::V6(_)) => IpAddr::V6(backend_v6(b)),
                _ => before.dst,
            };
            ensure!(
                seen.dst == want_dst,
                "destination {} (want {want_dst})",
                seen.dst
            );
            Some(b)
        }
        Out::Fields(f) => {
            let seen = inspect(&run.out)?;
            if let Some(mac) = f.dst_mac {
                ensure!(seen.dst_mac == mac, "destination MAC {:02x?}", seen.dst_mac);
            }
            if let Some(mac) = f.src_mac {
                ensure!(seen.src_mac == mac, "source MAC {:02x?}", seen.src_mac);
            }
            if let Some(src) = f.src {
                ensure!(seen.src == src, "source {} (want {src})", seen.src);
            }
            if let Some(dst) = f.dst {
                ensure!(seen.dst == dst, "destination {} (want {dst})", seen.dst);
            }
            if f.checksums_ok {
                ensure!(seen.checksums_ok, "a checksum does not verify: {seen:?}");
            }
            None
        }
    };
    match backend {
        Some(b) => row.to.check(memo, b),
        None => match row.to {
            To::Any => Ok(()),
            _ => bail!("the row names a backend but its output has none"),
        },
    }
}
