//! flotilla-cluster: Flotilla over many machines: the coordinator (the job state machine,
//! the scheduling loop, the journal), the worker agent, the protocol and file transfer.
//!
//! The coordinator's logic is a pure state machine ([`state::Coordinator`]): events in,
//! commands out, time injected, so every transition and failure path is unit-tested without
//! sockets. The [`Server`] around it journals events before acknowledging them and replays
//! the journal after a restart; [`run_worker`] is the agent on each machine; [`Client`] is
//! the API the CLI uses.

pub mod access;
mod agent;
pub mod alloc;
pub mod auth;
pub mod client;
mod convert;
mod energy;
pub mod error;
pub mod fault;
pub mod framed;
#[doc(hidden)]
pub mod fuzz;
pub mod ha;
mod idle;
pub mod journal;
pub mod objects;
pub mod proto;
mod sandbox_watch;
pub mod server;
pub mod sim;
pub mod state;
pub mod transport;
pub mod worker;

pub use client::{Client, Finished, GatheredOutput, Outputs, ProviderSummary, Submitted};
pub use error::{ClusterError, Result};
pub use server::{Server, ServerConfig};
pub use transport::{Remote, ServerTls};
pub use worker::{run_worker, WorkerConfig, WorkerGpu};
