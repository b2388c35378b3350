//! The server in-process: supervision of the core thread.

use std::net::SocketAddr;

use super::*;

#[tokio::test]
async fn a_panic_in_the_core_stops_the_server_with_an_error() {
    // The core thread once died alone: the process stayed up answering "stopping" forever.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path()))
        .await
        .expect("starts");
    server.core.send(Req::Panic).expect("the core is up");
    let e = server.wait().await.expect_err("a failed core is an error");
    assert!(
        e.to_string()
            .contains("the core thread panicked: injected by a test"),
        "{e}"
    );
}

#[tokio::test]
async fn a_stopped_server_ends_without_error() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path()))
        .await
        .expect("starts");
    server.stop();
    server.wait().await.expect("a clean stop");
}
