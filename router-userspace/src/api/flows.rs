//! `GET /flows`, `POST /flows/purge` and `GET /trace` (`switchyard flows`, `switchyard trace`).
//!
//! | endpoint | query / body | does |
//! |---|---|---|
//! | `GET /flows` | `?vip=&service=&backend=&client=` | the tracked flows that match |
//! | `POST /flows/purge` | `{"vip"?,"service"?,"backend"?,"client"?,"all"?}` | deletes them |
//! | `GET /trace` | `?client=IP:PORT&vip=IP:PORT/PROTO` | where a new flow would go |
//!
//! Names come from the event loop ([`Query::FlowCatalog`]); the table is read and purged on a
//! blocking thread (a pass over it takes up to a second); the generations a purge renews are a
//! [`Command::RenewGenerations`] of the event loop, the one writer of `BACKENDS`. A trace is a
//! [`Query::Trace`]: a dozen map reads, between two commands.

use std::net::SocketAddr;

use axum::{
    Json,
    extract::{Query, State},
    response::{IntoResponse, Response},
};
use router_common::{PROTO_TCP, PROTO_UDP};
use serde::{Deserialize, Serialize};

use super::{Api, answer, bad};
use crate::{
    agent::command::{Command, Query as AgentQuery},
    flows::{self, FlowQuery, FlowRow, Purged, Selector},
};

/// The selector of `q`, resolved against the agent's names.
async fn selector(api: &Api, q: &FlowQuery) -> Result<(Selector, flows::Catalog), Response> {
    let catalog = api.query(AgentQuery::FlowCatalog).await?;
    let selector = Selector::new(q, &catalog).map_err(bad)?;
    Ok((selector, catalog))
}

/// `GET /flows`: the tracked flows that match, as [`FlowRow`]s.
pub async fn list(State(api): State<Api>, Query(q): Query<FlowQuery>) -> Response {
    let (selector, catalog) = match selector(&api, &q).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let pin_dir = api.pin_dir.clone();
    let rows: Result<Vec<FlowRow>, String> = tokio::task::spawn_blocking(move || {
        flows::list(&pin_dir, &selector, &catalog).map_err(|e| format!("reading CONNTRACK: {e}"))
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    answer(Ok(rows))
}

/// The answer of `POST /flows/purge`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PurgeAnswer {
    /// Flows deleted from connection tracking.
    pub purged: u64,
    /// Backend slots whose generation was renewed.
    pub renewed: usize,
}

/// One purge pass on a blocking thread.
async fn pass(api: &Api, selector: &Selector) -> Result<Purged, String> {
    let pin_dir = api.pin_dir.clone();
    let selector = selector.clone();
    tokio::task::spawn_blocking(move || {
        flows::purge_pass(&pin_dir, &selector).map_err(|e| format!("purging CONNTRACK: {e}"))
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
}

/// `POST /flows/purge`: deletes the matching flows, renews their backends' generations, and
/// deletes again what a flow cache wrote back in between (decision 0033). A filter is
/// required, or `all`.
pub async fn purge(State(api): State<Api>, Json(q): Json<FlowQuery>) -> Response {
    if q.is_empty() && !q.all {
        return bad(
            "a purge needs a filter (vip, service, backend, client), or all (--all) to purge every \
             tracked flow",
        );
    }
    if !q.is_empty() && q.all {
        return bad("all (--all) purges every tracked flow: give it or a filter, not both");
    }
    let (selector, _) = match selector(&api, &q).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let first = match pass(&api, &selector).await {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    let slots: Vec<u32> = first.backends.iter().copied().collect();
    let renewed = if slots.is_empty() {
        Ok(Ok(0))
    } else {
        api.ask(|reply| Command::RenewGenerations { slots, reply })
            .await
    };
    let renewed = match renewed {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return bad(e),
        Err(r) => return r,
    };
    let second = match pass(&api, &selector).await {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    Json(PurgeAnswer {
        purged: first.flows + second.flows,
        renewed,
    })
    .into_response()
}

/// `GET /trace` query.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TraceQuery {
    /// `IP:PORT` (`[IPv6]:PORT`).
    pub client: String,
    /// `IP:PORT/PROTO`, `PROTO` `tcp` or `udp`.
    pub vip: String,
}

/// `vip` as `IP:PORT/PROTO`.
///
/// # Errors
///
/// Not of that form, or a protocol other than `tcp` and `udp`.
pub fn parse_vip(vip: &str) -> Result<(SocketAddr, u8), String> {
    let (addr, proto) = vip
        .rsplit_once('/')
        .ok_or_else(|| format!("{vip:?}: expected VIP:PORT/PROTO (198.18.0.10:80/tcp)"))?;
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => PROTO_TCP,
        "udp" => PROTO_UDP,
        other => return Err(format!("{vip:?}: protocol {other:?} is not tcp or udp")),
    };
    let addr = addr
        .parse()
        .map_err(|_| format!("{vip:?}: {addr:?} is not IP:PORT ([2001:db8::10]:80 for IPv6)"))?;
    Ok((addr, proto))
}

/// `GET /trace`.
pub async fn trace(State(api): State<Api>, Query(q): Query<TraceQuery>) -> Response {
    let client: SocketAddr = match q.client.parse() {
        Ok(c) => c,
        Err(_) => {
            return bad(format!(
                "client {:?} is not IP:PORT ([2001:db8::1]:5000 for IPv6)",
                q.client
            ));
        }
    };
    let (vip, proto) = match parse_vip(&q.vip) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    answer(
        api.query(|reply| AgentQuery::Trace {
            client,
            vip,
            proto,
            reply,
        })
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vip_is_address_port_and_protocol() {
        assert_eq!(
            parse_vip("198.18.0.10:80/tcp").unwrap(),
            ("198.18.0.10:80".parse().unwrap(), PROTO_TCP)
        );
        assert_eq!(
            parse_vip("[2001:db8::10]:53/UDP").unwrap(),
            ("[2001:db8::10]:53".parse().unwrap(), PROTO_UDP)
        );
        assert!(
            parse_vip("198.18.0.10:80")
                .unwrap_err()
                .contains("expected")
        );
        assert!(
            parse_vip("198.18.0.10:80/sctp")
                .unwrap_err()
                .contains("sctp")
        );
        assert!(
            parse_vip("198.18.0.10/tcp")
                .unwrap_err()
                .contains("IP:PORT")
        );
    }
}
