//! TLS end to end: a coordinator with a self-signed certificate (rcgen, for `localhost` and
//! 127.0.0.1), a worker and the CLI verifying it with `--tls-ca`; a plain-TCP client and a
//! client with the right CA but a wrong token are both refused with a clear error; the
//! worker's object server (transfer staging, gathering) and the gang rendezvous are reached
//! over TLS as well.

#![allow(clippy::unwrap_used)]

mod kit;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kit::{assert_succeeded, job_id_of, Cluster, Opts};

/// Writes a self-signed certificate and its key (PEM) into `dir`; returns (cert, key).
fn self_signed(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

fn tls_cluster(certs: &std::path::Path) -> (Cluster, PathBuf) {
    let (cert, key) = self_signed(certs);
    let s = |p: &PathBuf| p.display().to_string();
    let opts = Opts {
        server_args: vec!["--tls-cert".into(), s(&cert), "--tls-key".into(), s(&key)],
        remote_args: vec!["--tls-ca".into(), s(&cert)],
        tls_ca: Some(cert.clone()),
        ..Opts::default()
    };
    (Cluster::start_with(1, 2, opts), cert)
}

#[test]
fn job_runs_over_tls_and_plain_or_wrong_token_clients_are_refused() {
    let certs = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (c, cert) = tls_cluster(certs.path());
    // The worker registered over TLS (start_with waits for it, through the kit's TLS client).
    assert_eq!(c.live_workers().len(), 1);

    let toml = "name = \"tls\"\nstaging = \"shared\"\n\n\
        [[task]]\nid = \"a\"\ncmd = [\"sh\", \"-c\", \"echo over-tls > a.txt\"]\noutputs = [\"a.txt\"]\n\n\
        [[task]]\nid = \"b\"\ncmd = [\"sh\", \"-c\", \"cat a.txt a.txt > b.txt\"]\nafter = [\"a\"]\noutputs = [\"b.txt\"]\n";
    let file = c.job_dir().join("tls.toml");
    std::fs::write(&file, toml).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "submit --wait over TLS failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = job_id_of(&out);
    let s = c.wait_job(job, Duration::from_secs(30));
    assert_succeeded(&s);
    assert_eq!(
        std::fs::read_to_string(c.job_dir().join("b.txt")).unwrap(),
        "over-tls\nover-tls\n"
    );

    // Transfer staging over TLS: the worker fetches an uploaded job-folder file from the
    // coordinator (TLS), and `submit --wait` gathers the output back.
    std::fs::write(c.job_dir().join("in.txt"), "uploaded\n").unwrap();
    let toml = "name = \"tls-transfer\"\nstaging = \"transfer\"\n\n\
        [[task]]\nid = \"t\"\ninputs = [\"in.txt\"]\n\
        cmd = [\"sh\", \"-c\", \"cat in.txt in.txt > t.txt\"]\noutputs = [\"t.txt\"]\n";
    let file = c.job_dir().join("tls-transfer.toml");
    std::fs::write(&file, toml).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "transfer job over TLS failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(c.job_dir().join("t.txt")).unwrap(),
        "uploaded\nuploaded\n"
    );

    // The worker's object server (where that output was gathered from) speaks TLS too: a
    // plain-TCP fetch gets nothing, not even the ticket check.
    let data_addr: std::net::SocketAddr =
        c.overview().unwrap().workers[0].data_addr.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plain = rt.block_on(flotilla::cluster::framed::fetch_framed(
        data_addr,
        "no-ticket",
        &"ab".repeat(32),
    ));
    let err = plain
        .expect_err("a plain-TCP fetch was answered")
        .to_string();
    assert!(
        !err.contains("invalid token or ticket") && !err.contains("not held here"),
        "the object server answered in plain TCP: {err}"
    );

    // A gang meets at the coordinator's rendezvous over TLS: the members are given the
    // certificate's fingerprint (FLOTILLA_RENDEZVOUS_CERT) and trust only it.
    let toml = format!(
        "name = \"tls-gang\"\n[[task]]\nid = \"rank\"\ngroup = {{ size = 2 }}\n\
         resources = {{ cpus = 1 }}\n\
         cmd = [\"sh\", \"-c\", \"test -n \\\"$FLOTILLA_RENDEZVOUS_CERT\\\" && exec '{}' bench \
         allreduce-rank --bytes 4KiB --rounds 1 --transport tcp > gang-$FLOTILLA_RANK.json\"]\n",
        kit::BIN
    );
    let gang = c.submit_toml("tls-gang.toml", &toml);
    assert_succeeded(&c.wait_job(gang, Duration::from_secs(60)));
    assert!(c.job_dir().join("gang-1.json").is_file());

    // Plain HTTP against the TLS port: refused, and the error names the connection.
    let out = c.cli_raw(&["status"], &[], &c.token);
    assert!(!out.status.success(), "a plain-TCP client was served");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("tls") && err.contains(&c.addr.to_string()),
        "plain client: {err:?} does not say that the server wants TLS"
    );

    // The right CA with a wrong token: refused by the token check.
    let ca = vec!["--tls-ca".to_string(), cert.display().to_string()];
    let out = c.cli_raw(&["status"], &ca, "0123456789abcdef-not-the-token");
    assert!(!out.status.success(), "a wrong token was accepted over TLS");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("token") || err.contains("unauthenticated"),
        "wrong token over TLS: {err:?} does not say the token was refused"
    );

    // A CA that did not sign the server's certificate: refused by the TLS handshake.
    let other = tempfile::tempdir().unwrap();
    let (other_cert, _) = self_signed(other.path());
    let bad_ca = vec!["--tls-ca".to_string(), other_cert.display().to_string()];
    let out = c.cli_raw(&["status"], &bad_ca, &c.token);
    assert!(
        !out.status.success(),
        "a server with an unknown CA was trusted"
    );
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("certificate"),
        "unknown CA: {err:?} does not name the certificate"
    );
    // Something answered: the error says so, not that no coordinator runs there (it did, and
    // was sought for the whole --connect-timeout before).
    assert!(
        err.contains("does not verify") && !err.contains("no coordinator answered"),
        "unknown CA: {err:?} does not say the certificate does not verify"
    );
    // A worker without --tls-ca says the server may speak TLS, as a client does (it logged
    // only "h2 protocol error", again and again).
    let log = certs.path().join("plain-worker.log");
    let mut plain = std::process::Command::new(kit::BIN)
        .args([
            "worker",
            "--cpus",
            "1",
            "--gpus",
            "none",
            "--isolation",
            "none",
        ])
        .env("FLOTILLA_SERVER", c.addr.to_string())
        .env("FLOTILLA_TOKEN", &c.token)
        .current_dir(certs.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    kit::wait_until(
        "the plain worker to say the server may speak TLS",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|l| l.contains("the server may speak TLS"))
        },
    );
    let _ = plain.kill();
    let _ = plain.wait();
    // A worker given a CA that did not sign the coordinator's certificate stops, saying so
    // (it retried forever, every two seconds, with settings it reads once).
    let out = worker_that_stops(&c.addr.to_string(), &other_cert, &c.token);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not verify") && err.contains("--tls-ca"),
        "a worker with the wrong CA: {err}"
    );

    // An https:// address without --tls-ca verifies against the system's trust store, which
    // SSL_CERT_FILE points at here (it failed: "Connecting to HTTPS without TLS enabled").
    let https = format!("https://localhost:{}", c.addr.port());
    let out = c
        .cli_command(&["status"], &c.token)
        .env("FLOTILLA_SERVER", &https)
        .env("SSL_CERT_FILE", &cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{https} with the CA in the trust store: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c
        .cli_command(&["status"], &c.token)
        .env("FLOTILLA_SERVER", &https)
        .env("SSL_CERT_FILE", &other_cert)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        !out.status.success() && err.contains("does not verify"),
        "{https}, its CA not trusted: {err:?}"
    );
    eprintln!(
        "tls test: {:.2} s; unknown CA error: {}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `flotilla worker` of one CPU for `server` with `--tls-ca ca`, run to its end (the
/// callers' settings make it stop at once).
fn worker_that_stops(server: &str, ca: &std::path::Path, token: &str) -> std::process::Output {
    std::process::Command::new(kit::BIN)
        .args([
            "worker",
            "--cpus",
            "1",
            "--gpus",
            "none",
            "--isolation",
            "none",
        ])
        .args(["--server", server, "--tls-ca"])
        .arg(ca)
        .env("FLOTILLA_TOKEN", token)
        .env_remove("FLOTILLA_SERVER")
        .current_dir(ca.parent().unwrap())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// `--tls-cert` and `--tls-key` given the wrong way round, or a key of another certificate:
/// the server does not start, and says it of the flags (it blamed "the gang rendezvous").
#[test]
fn a_server_given_unusable_tls_files_names_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let other = tempfile::tempdir().unwrap();
    let (_, other_key) = self_signed(other.path());
    for (c, k, says) in [
        (&key, &cert, "--tls-cert must hold the certificate"),
        (
            &cert,
            &other_key,
            "--tls-key is not the private key of --tls-cert",
        ),
    ] {
        let out = std::process::Command::new(kit::BIN)
            .args(["server", "--listen", "127.0.0.1:0", "--state"])
            .arg(dir.path().join("state"))
            .arg("--tls-cert")
            .arg(c)
            .arg("--tls-key")
            .arg(k)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        // Refused before a state folder and an admin token are made for it.
        assert!(!dir.path().join("state").exists(), "{err}");
        assert!(
            err.contains("--tls-cert") && err.contains(says) && !err.contains("rendezvous"),
            "{err}"
        );
    }
}

/// A TLS client against a plain-TCP coordinator is told so at once (it was retried for the
/// whole --connect-timeout, then read as no coordinator answering).
#[test]
fn a_tls_client_of_a_plain_coordinator_is_told_at_once() {
    let c = Cluster::start(0, 1);
    let certs = tempfile::tempdir().unwrap();
    let (cert, _) = self_signed(certs.path());
    let started = Instant::now();
    let out = c.cli(&[
        "status",
        "--tls-ca",
        &cert.display().to_string(),
        "--connect-timeout",
        "10m",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("answers in plain TCP, not TLS: leave out --tls-ca"),
        "{err}"
    );
    // Not retried until the 10 minutes are up (a bound for a hung test only).
    assert!(started.elapsed() < Duration::from_secs(300), "{err}");
    // A key given for the CA: said (it read as no CA, and failed as UnknownIssuer).
    let (_, key) = self_signed(certs.path());
    let out = c.cli(&["status", "--tls-ca", &key.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the file holds no certificate"), "{err}");
    // An http:// address with --tls-ca: the contradiction named (an HTTP/2 protocol error).
    let http = format!("http://{}", c.addr);
    let out = c.cli(&[
        "status",
        "--server",
        &http,
        "--tls-ca",
        &cert.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("says plain TCP (http://) but --tls-ca"),
        "{err}"
    );
    // A worker so configured stops, saying the same (it retried forever).
    let out = worker_that_stops(&http, &cert, &c.token);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("says plain TCP (http://) but --tls-ca"),
        "{err}"
    );
}
