//! The generated protocol types and services (`proto/flotilla.proto`).
#![allow(missing_docs, unreachable_pub, clippy::all)]

tonic::include_proto!("flotilla.v1");

/// The protocol version a worker must speak to register.
pub const PROTOCOL_VERSION: u32 = 1;
