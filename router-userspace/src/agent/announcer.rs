//! The event loop's announcement step ([`crate::announce`]): after every command, the routes
//! follow what the maps now say; on SIGINT/SIGTERM they are withdrawn before anything else.

use std::collections::BTreeSet;

use log::warn;

use super::runtime::Runtime;
use crate::announce::Routes;

/// The announcement routes of a running agent, following `announce:` of the running config.
#[derive(Default)]
pub(super) struct Announcer {
    /// The routes, while `announce:` is set and the rtnetlink socket opened.
    routes: Option<Routes>,
    /// Whether the last attempt to open the routes failed (logged once until one succeeds).
    failing: bool,
    /// [`Runtime::attached`] as last read: read at the first pass and once a second (with
    /// `refresh`), not at every command (it asks the kernel about every interface).
    attached: Option<bool>,
}

impl Announcer {
    /// Makes the routes what [`crate::announce::wanted`] says, after the command that changed the
    /// maps returned (a route never precedes the write it announces). Settings that changed
    /// withdraw everything under the old ones first; without `announce:` nothing is done.
    /// `refresh` re-reads the routes from the kernel first (once a second).
    pub(super) async fn follow(&mut self, rt: &mut Runtime, refresh: bool) {
        let settings = rt.config.announce.clone();
        if self.routes.as_ref().map(Routes::settings) != settings.as_ref()
            && let Some(mut old) = self.routes.take()
        {
            old.withdraw_all().await;
        }
        if self.routes.is_none()
            && let Some(s) = settings.clone()
        {
            match Routes::open(s).await {
                Ok(routes) => {
                    self.routes = Some(routes);
                    self.failing = false;
                }
                Err(e) => {
                    if !self.failing {
                        warn!("announcing nothing: {e}; retried every second");
                    }
                    self.failing = true;
                }
            }
        }
        if refresh
            && let Some(routes) = &mut self.routes
            && !routes.refresh().await
        {
            warn!(
                "the announcement interface {} is gone or was replaced; opening it again",
                routes.settings().interface
            );
            self.routes = None;
            rt.announced = settings.as_ref().map(|_| BTreeSet::new());
            return;
        }
        match &mut self.routes {
            Some(routes) => {
                let attached = match self.attached {
                    Some(a) if !refresh => a,
                    _ => *self.attached.insert(rt.attached()),
                };
                let wanted = crate::announce::wanted(attached, rt.publisher.vips());
                let new = routes.sync(&wanted).await;
                routes.advertise(&new).await;
                rt.announced = Some(routes.announced().clone());
            }
            None => rt.announced = settings.map(|_| BTreeSet::new()),
        }
    }

    /// Withdraws every announcement (shutdown).
    pub(super) async fn withdraw(&mut self, rt: &mut Runtime) {
        if let Some(routes) = &mut self.routes {
            routes.withdraw_all().await;
            rt.announced = Some(routes.announced().clone());
        }
    }
}
