//! What the suites share: the setup of an agent on a topology with its servers, the fragments
//! the agent suites write, the checks they repeat, and client connections sampled over time.

pub mod cli;
pub mod fragments;
pub mod lb;
pub mod maps;
pub mod sampling;

use std::time::Duration;

pub use cli::{ctl, dir_arg, generation, live_after, metric, refused, wait_metric};
pub use fragments::{BROKEN, FIXED, broken_errors, dns, web};
pub use lb::{Lb, check_spread, consistent, lb_interfaces, no_xdp_on_lb, serves};
pub use maps::view;

/// How long a change may take to be live: the watch's debounce (200 ms) plus one apply, with
/// a wide margin for a loaded 2-core machine.
pub const LIVE_LIMIT: Duration = Duration::from_secs(5);

/// How long a start that must fail may take (the program load dominates).
pub const EXIT_LIMIT: Duration = Duration::from_secs(20);
