//! The HTTP API on `agent.api`: `GET /status` (JSON), `GET /metrics` (Prometheus text format),
//! and the operator endpoints of [`ctl`] and [`versions`]. With `agent.api_token_file` every
//! request needs its bearer token ([`Auth`]); that is what lets it listen beyond loopback.
//!
//! Handlers change nothing themselves: a change is a [`Command`] for the agent's event loop,
//! a read a [`Query`] answered there between two commands, and the history's versions are read
//! on the history thread ([`Recorder`]).

pub mod classes;
pub mod ctl;
pub mod flows;
pub mod metrics;
pub mod status;
pub mod versions;
pub mod weights;

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use tokio::sync::{mpsc, oneshot};

use crate::agent::{
    command::{Command, Query},
    recorder::Recorder,
};

/// What every handler has.
#[derive(Clone, Debug)]
pub struct Api {
    /// The event loop's queue.
    pub commands: mpsc::Sender<Command>,
    /// The history thread.
    pub recorder: Recorder,
    /// The agent's metric families.
    pub metrics: metrics::Metrics,
    /// Where the maps are pinned (read off the event loop: the tracked flows of drained
    /// backends).
    pub pin_dir: std::path::PathBuf,
    /// Who may ask.
    pub auth: Auth,
}

/// The API's access rule (`agent.api_token_file`, `agent.api_open_read`).
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// The bearer token every request must carry; `None`: none is asked (a loopback API).
    pub token: Option<std::sync::Arc<str>>,
    /// `GET` requests are answered without the token.
    pub open_read: bool,
}

impl Auth {
    /// Whether a request with `method` and `authorization` (the header's value) may be
    /// answered: no token set, an open read, or `Bearer TOKEN` (RFC 6750 §2.1) with the token,
    /// compared in time independent of where it differs.
    #[must_use]
    pub fn allows(&self, method: &axum::http::Method, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        if self.open_read && method == axum::http::Method::GET {
            return true;
        }
        let Some(given) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        let want = token.as_bytes();
        given.len() == want.len()
            && given
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Answers `401` to a request [`Auth::allows`] refuses, before any handler runs.
async fn authorize(
    State(auth): State<Auth>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(axum::http::HeaderValue::as_bytes);
    if auth.allows(request.method(), header) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(serde_json::json!({
            "error": "missing or wrong bearer token (agent.api_token_file, which the agent \
                      reads when it starts: after changing the file, restart the agent)"
        })),
    )
        .into_response()
}

impl Api {
    /// Sends `command` (built around a reply channel) and waits for the answer.
    pub(crate) async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, Response> {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(command(reply)).await.is_err() {
            return Err(bad("the agent is shutting down"));
        }
        answer
            .await
            .map_err(|_| bad("the agent dropped the request"))
    }

    /// [`ask`](Self::ask) for a query.
    pub(crate) async fn query<T>(
        &self,
        query: impl FnOnce(oneshot::Sender<T>) -> Query,
    ) -> Result<T, Response> {
        self.ask(|reply| Command::Query(query(reply))).await
    }
}

/// `400 {"error": "…"}`.
pub(crate) fn bad(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": e.to_string() })),
    )
        .into_response()
}

/// An answer that is a value or a problem: JSON, or `400`.
pub(crate) fn answer<T: serde::Serialize>(r: Result<Result<T, String>, Response>) -> Response {
    match r {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => bad(e),
        Err(r) => r,
    }
}

/// Serves the API on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, api: Api) {
    let app = Router::new()
        .route("/status", get(status))
        .route("/state", get(ctl::get_state).post(ctl::set_state))
        .route("/override", post(ctl::set_override))
        .route("/override/{group}", delete(ctl::clear_override))
        .route("/backend/drain", post(ctl::drain))
        .route("/backend/undrain", post(ctl::undrain))
        .route("/decisions", get(ctl::decisions_log))
        .route("/explain/{group}", get(ctl::explain))
        .route("/what-if", post(ctl::what_if))
        .route("/apply", post(versions::apply))
        .route("/rollback/{n}", post(versions::rollback))
        .route("/versions", get(versions::list))
        .route("/versions/{n}", get(versions::show))
        .route("/diff/{a}/{b}", get(versions::diff))
        .route("/weights/{pool}", get(weights::get))
        .route("/canary/{group}", get(ctl::canary_status))
        .route("/canary/{group}/{op}", post(ctl::canary_op))
        .route("/flows", get(flows::list))
        .route("/flows/purge", post(flows::purge))
        .route("/trace", get(flows::trace))
        .route("/classes", get(classes::list))
        .route("/metrics", get(scrape))
        .layer(axum::middleware::from_fn_with_state(
            api.auth.clone(),
            authorize,
        ))
        .with_state(api);
    if let Err(e) = axum::serve(listener, app).await {
        log::error!("API stopped: {e}");
    }
}

async fn status(State(api): State<Api>) -> Response {
    let mut status = match api.query(Query::Status).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    open_flows_of_drains(&api, &mut status).await;
    open_flows_of_left_pools(&api, &mut status).await;
    Json(status).into_response()
}

/// Counts the tracked flows of every drained backend in `status`, from connection tracking,
/// on a blocking thread: a pass over the table takes up to a second, and the event loop
/// decides failovers meanwhile.
async fn open_flows_of_drains(api: &Api, status: &mut status::Status) {
    let slots: Vec<u32> = status
        .pools
        .iter()
        .flat_map(|p| &p.backends)
        .filter_map(|b| b.drain.as_ref().map(|d| d.slot))
        .collect();
    if slots.is_empty() {
        return;
    }
    let pin_dir = api.pin_dir.clone();
    let counted =
        tokio::task::spawn_blocking(move || crate::dataplane::counters::flows_of(&pin_dir, &slots))
            .await;
    let counts = match counted {
        Ok(Ok(counts)) => counts,
        Ok(Err(e)) => {
            log::warn!("counting the tracked flows of drained backends: {e}");
            return;
        }
        Err(_) => return,
    };
    for d in status
        .pools
        .iter_mut()
        .flat_map(|p| p.backends.iter_mut())
        .filter_map(|b| b.drain.as_mut())
    {
        d.open_flows = counts.get(&d.slot).copied();
    }
}

/// Counts the tracked flows on every pool a decision group failed back away from, like
/// [`open_flows_of_drains`], and sets the `switchyard_failback_open_flows` gauge.
async fn open_flows_of_left_pools(api: &Api, status: &mut status::Status) {
    let slots: Vec<u32> = status
        .pools
        .iter()
        .filter_map(|p| p.left.as_ref())
        .flat_map(|l| l.slots.iter().copied())
        .collect();
    if slots.is_empty() {
        return;
    }
    let pin_dir = api.pin_dir.clone();
    let counted =
        tokio::task::spawn_blocking(move || crate::dataplane::counters::flows_of(&pin_dir, &slots))
            .await;
    let counts = match counted {
        Ok(Ok(counts)) => counts,
        Ok(Err(e)) => {
            log::warn!("counting the tracked flows of pools left by a failback: {e}");
            return;
        }
        Err(_) => return,
    };
    for p in &mut status.pools {
        let name = p.name.clone();
        if let Some(l) = p.left.as_mut() {
            let open: u64 = l.slots.iter().filter_map(|s| counts.get(s)).sum();
            l.open_flows = Some(open);
            api.metrics.set_failback_open_flows(&l.group, &name, open);
        }
    }
}

async fn scrape(State(api): State<Api>) -> Response {
    let scrape = match api.query(Query::Scrape).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let registry = metrics::registry(&api.metrics, scrape);
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::Auth;

    fn auth(open_read: bool) -> Auth {
        Auth {
            token: Some("0123456789abcdef0123".into()),
            open_read,
        }
    }

    #[test]
    fn without_a_token_every_request_is_answered() {
        assert!(Auth::default().allows(&Method::POST, None));
    }

    #[test]
    fn with_a_token_only_its_bearer_is_answered() {
        let a = auth(false);
        assert!(a.allows(&Method::POST, Some(b"Bearer 0123456789abcdef0123")));
        assert!(!a.allows(&Method::GET, None));
        assert!(!a.allows(&Method::GET, Some(b"Bearer 0123456789abcdef012")));
        assert!(!a.allows(&Method::GET, Some(b"Bearer 0123456789abcdef01234")));
        assert!(!a.allows(&Method::GET, Some(b"Bearer 0123456789abcdef0124")));
        assert!(!a.allows(&Method::GET, Some(b"Basic 0123456789abcdef0123")));
        assert!(!a.allows(&Method::GET, Some(b"0123456789abcdef0123")));
    }

    #[test]
    fn open_reads_answer_gets_only() {
        let a = auth(true);
        assert!(a.allows(&Method::GET, None));
        assert!(!a.allows(&Method::POST, None));
        assert!(!a.allows(&Method::DELETE, Some(b"Bearer wrong")));
    }
}
