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
pub mod kube;
pub mod objects;
pub mod plan;
pub mod proto;
mod sandbox_watch;
pub mod server;
pub mod sim;
pub mod state;
pub mod transport;
pub mod worker;

pub use client::{Client, Finished, GatheredOutput, Outage, Outputs, ProviderSummary, Submitted};
pub use error::{ClusterError, Result};
pub use server::{Server, ServerConfig};
pub use transport::{Remote, ServerTls};
pub use worker::{run_worker, WorkerConfig, WorkerGpu};

/// The future of an entry point of this crate (the [`Client`]'s calls, [`Server::start`],
/// [`run_worker`]...): boxed, so that its body is compiled here, once.
///
/// An `async fn`'s body is compiled in the crate that polls it, with every generic it reaches
/// (tonic, hyper, openraft, tokio's tasks). Called from the `flotilla` library and binary, the
/// whole coordinator, worker and client were compiled three times in a release build; behind a
/// `dyn Future` made here they are compiled in this crate only (see ARCHITECTURE.md, "Build
/// time"). One allocation per call is the price.
pub type Boxed<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Boxes `f` as a [`Boxed`] future. Called in a non-generic function of the crate that defines
/// `f`, it compiles `f`'s body in that crate (the `flotilla` library's benchmarks use it too).
pub fn boxed<'a, T, F: std::future::Future<Output = T> + Send + 'a>(f: F) -> Boxed<'a, T> {
    Box::pin(f)
}
