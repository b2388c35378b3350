//! The protocol's Rust code is generated from `proto/flotilla.proto` and checked in
//! (`src/generated/flotilla.v1.rs`), so that building Flotilla builds no protobuf compiler.
//! This test generates it afresh, as the build script did, and fails when the checked-in file
//! differs; `FLOTILLA_BLESS=1 cargo test -p flotilla-cluster --test proto_generated` rewrites
//! it after a change to the `.proto`.

use std::fs;
use std::path::Path;

#[test]
fn the_checked_in_protocol_code_is_what_the_proto_file_generates() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_dir = crate_dir.join("../../proto");
    let fds = protox::compile([proto_dir.join("flotilla.proto")], [&proto_dir])
        .expect("proto/flotilla.proto compiles");
    let out = tempfile::tempdir().expect("a scratch directory");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .out_dir(out.path())
        .compile_fds(fds)
        .expect("tonic-prost-build generates the code");
    let fresh = fs::read_to_string(out.path().join("flotilla.v1.rs")).expect("generated file");
    let checked_in = crate_dir.join("src/generated/flotilla.v1.rs");
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        fs::write(&checked_in, &fresh).expect("rewrite the checked-in file");
        return;
    }
    let current = fs::read_to_string(&checked_in).expect("the checked-in file");
    assert!(
        current == fresh,
        "{} is stale: proto/flotilla.proto changed; run \
         FLOTILLA_BLESS=1 cargo test -p flotilla-cluster --test proto_generated",
        checked_in.display()
    );
}
