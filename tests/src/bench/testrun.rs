//! Timing an XDP program with `BPF_PROG_TEST_RUN`, and the baseline program it is compared to.
//!
//! With `repeat = N` the kernel runs the program N times on one frame and reports the mean
//! duration per run, in whole nanoseconds (`bpf_test_run`: the clock is read when the loop
//! starts and when it ends, and time spent rescheduling is left out). Every run sees the same
//! frame and the maps as the previous run left them, so a repeated frame measures the
//! steady state of one flow (a conntrack hit). A first packet of a flow can only be measured
//! with `repeat = 1`, where the reported time also holds one clock read and the loop's entry
//! and exit: [`time`] the same frames with the baseline at `repeat = 1` to know that overhead.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use switchyard::dataplane::object::{self, BASELINE_PROGRAM};

/// One timed test run.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// The XDP action of the last run.
    pub action: u32,
    /// The kernel-reported mean duration of one run, in nanoseconds.
    pub ns: f64,
}

/// `struct xdp_md` for a frame of `len` bytes arriving on `ingress`: `data`, `data_end`,
/// `data_meta`, `ingress_ifindex`, `rx_queue_index`, `egress_ifindex`.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "a frame's length, at most a page, as the u32 `data_end`"
)]
pub fn xdp_md(ingress: u32, len: usize) -> Vec<u8> {
    [0u32, len as u32, 0, ingress, 0, 0]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect()
}

/// Runs `prog` `repeat` times on `frame` as if it arrived on `ingress` (an ifindex of the
/// calling thread's namespace) and returns the kernel's timing.
///
/// # Errors
///
/// When `BPF_PROG_TEST_RUN` fails (a frame the kernel refuses, an unknown `ingress`).
#[expect(
    clippy::cast_precision_loss,
    reason = "a mean duration in nanoseconds, far below 2^52"
)]
pub fn time(prog: &Xdp, frame: &[u8], ingress: u32, repeat: u32) -> Result<Timed> {
    let md = xdp_md(ingress, frame.len());
    let opts = TestRunOptions {
        data_in: Some(frame),
        ctx_in: Some(&md),
        repeat,
        ..TestRunOptions::default()
    };
    let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    Ok(Timed {
        action: r.return_value,
        ns: r.duration.as_nanos() as f64,
    })
}

/// The baseline program (`router-ebpf/src/bin/baseline.rs`: parse Ethernet and IPv4/IPv6,
/// swap the MACs, `XDP_TX`), loaded and verified, with the object's `lookup` yardstick and
/// `reset` wrapper.
pub struct Baseline {
    ebpf: Ebpf,
}

impl Baseline {
    /// Loads the embedded baseline object ([`object::baseline`]).
    ///
    /// # Errors
    ///
    /// When the build embedded a stub object, the object cannot be parsed, or the verifier
    /// refuses the program.
    pub fn load() -> Result<Self> {
        let mut ebpf = Ebpf::load(object::baseline()?).context("loading the baseline object")?;
        for name in [BASELINE_PROGRAM, LOOKUP_PROGRAM, RESET_PROGRAM] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .with_context(|| format!("the baseline object has no program {name}"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("verifying the baseline program {name}"))?;
        }
        Ok(Self { ebpf })
    }

    /// The loaded baseline program.
    ///
    /// # Errors
    ///
    /// Never once [`Baseline::load`] succeeded: the program is there and is an XDP program.
    pub fn program(&self) -> Result<&Xdp> {
        self.named(BASELINE_PROGRAM)
    }

    /// The baseline plus one hash-map lookup that misses (`lookup` in
    /// `router-ebpf/src/bin/baseline.rs`): the yardstick of "one lookup".
    ///
    /// # Errors
    ///
    /// Never once [`Baseline::load`] succeeded.
    pub fn lookup(&self) -> Result<&Xdp> {
        self.named(LOOKUP_PROGRAM)
    }

    /// Makes the reset wrapper ([`Baseline::reset`]) tail-call the program `target`.
    ///
    /// # Errors
    ///
    /// When `target` cannot be put into the wrapper's program array.
    pub fn set_reset_target(&mut self, target: &aya::programs::ProgramFd) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(RESET_TARGET)
            .context("the baseline object has no reset target map")?;
        let mut array = aya::maps::ProgramArray::try_from(map)?;
        array.set(0, target, 0)?;
        Ok(())
    }

    /// The reset wrapper (`reset` in `router-ebpf/src/bin/baseline.rs`): undoes a previous
    /// run's IPv4-in-IPv4 encapsulation and tail-calls its target
    /// ([`Baseline::set_reset_target`]), which lets an encapsulating program run with `repeat`
    /// on one buffer.
    ///
    /// # Errors
    ///
    /// Never once [`Baseline::load`] succeeded.
    pub fn reset(&self) -> Result<&Xdp> {
        self.named(RESET_PROGRAM)
    }

    fn named(&self, name: &str) -> Result<&Xdp> {
        Ok(self
            .ebpf
            .program(name)
            .with_context(|| format!("the baseline object has no program {name}"))?
            .try_into()?)
    }
}

/// Name of the one-lookup yardstick inside the baseline object.
pub const LOOKUP_PROGRAM: &str = "lookup";
/// Name of the reset wrapper inside the baseline object, and of its program array.
pub const RESET_PROGRAM: &str = "reset";
const RESET_TARGET: &str = "RESET_TARGET";
