//! The generated protocol types and services (`proto/flotilla.proto`).
#![allow(missing_docs, unreachable_pub, clippy::all)]

tonic::include_proto!("flotilla.v1");

/// The protocol version a worker must speak to register.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest gRPC message either side sends or accepts: a submit carries the job's uploaded
/// files (at most [`MAX_UPLOAD_BYTES`](crate::client::MAX_UPLOAD_BYTES)) and its text.
pub const MAX_MESSAGE_BYTES: usize = crate::client::MAX_UPLOAD_BYTES as usize + (16 << 20);
