//! The agent as an operator runs it: the real `switchyard` binary in the lb namespace of a
//! topology, with a config directory — how it starts and refuses to, follows its directory and
//! reloads, keeps versions and its history store, restarts and hands the program over, upgrades
//! it, answers on its API and CLI, and resolves next hops.

mod api;
mod cli;
mod history;
mod links;
mod modes;
mod next_hops;
mod overrides;
mod reload;
mod restart;
mod start;
mod upgrade;
mod versions;
mod watch;
