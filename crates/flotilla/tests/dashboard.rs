//! The dashboard in a real browser: headless Chromium driven through ChromeDriver
//! (WebDriver, with fantoccini). Log in with the token, see the running job, its Gantt bars
//! appear, the job reach "succeeded", a task's log. A screenshot of the job's page is saved
//! as `target/dashboard.png`; on failure, `target/dashboard-failure.png`.
//!
//! Needs `chromium` and `chromium-driver` (Debian). Without them the test says so and
//! passes, unless `FLOTILLA_REQUIRE_BROWSER=1` (CI, which installs them).

#![allow(clippy::unwrap_used)]

mod kit;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use kit::{Cluster, Opts};

const WAIT: Duration = Duration::from_secs(60);

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}

/// ChromeDriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn start_driver(driver: &Path) -> Driver {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        // "ChromeDriver was started successfully on port N."; it exits if the port is taken.
        let mut ok = false;
        for line in out.lines() {
            let Ok(line) = line else { break };
            eprintln!("[chromedriver] {line}");
            if line.contains("started successfully") {
                ok = true;
                break;
            }
        }
        if ok {
            return Driver { child, port };
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("chromedriver did not start");
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let chromium = find("chromium").or_else(|| find("chromium-browser"));
    let mut opts = serde_json::json!({
        "args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-quic", "--no-first-run", "--window-size=1400,1100",
            format!("--user-data-dir={}", profile.display()),
        ]
    });
    if let Some(c) = chromium {
        opts["binary"] = serde_json::Value::String(c.display().to_string());
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), opts);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session")
}

/// Polls `check` every 50 ms until it gives `Some`, or fails naming `what`.
async fn until<T, F, Fut>(what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > end {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn text_of(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn click(c: &Client, css: &str) -> Result<(), String> {
    let e = c
        .find(Locator::Css(css))
        .await
        .map_err(|e| format!("{css}: {e}"))?;
    e.click().await.map_err(|e| format!("clicking {css}: {e}"))
}

async fn type_in(c: &Client, css: &str, text: &str) -> Result<(), String> {
    let e = c
        .find(Locator::Css(css))
        .await
        .map_err(|e| format!("{css}: {e}"))?;
    e.send_keys(text)
        .await
        .map_err(|e| format!("typing into {css}: {e}"))
}

async fn count(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.map_or(0, |v| v.len())
}

async fn session(
    c: &Client,
    http: std::net::SocketAddr,
    token: &str,
    go: &Path,
    tasks: usize,
) -> Result<(), String> {
    // The login page; a wrong token is refused there.
    c.goto(&format!("http://{http}/"))
        .await
        .map_err(|e| e.to_string())?;
    type_in(c, "#token", "wrong").await?;
    click(c, "#login").await?;
    until("the refusal", || async {
        text_of(c, ".error")
            .await
            .filter(|t| t.contains("not valid"))
    })
    .await?;
    type_in(c, "#token", token).await?;
    click(c, "#login").await?;

    // The cluster page: the workers and the running job, live.
    until("two workers", || async {
        (count(c, ".worker-row").await == 2).then_some(())
    })
    .await?;
    until("the running job", || async {
        text_of(c, ".job-row .state")
            .await
            .filter(|t| t == "running")
    })
    .await?;
    click(c, ".job-row").await?;

    // The job's page: the first tiles' bars, then running bars while the others wait for
    // `go` (the screenshot for the docs is taken then).
    until("finished and running Gantt bars", || async {
        (count(c, "rect.gantt-bar.o-succeeded").await >= 4
            && count(c, "rect.gantt-bar.o-running").await >= 2)
            .then_some(())
    })
    .await?;
    assert_eq!(text_of(c, "#job-state").await.as_deref(), Some("running"));
    if let Ok(png) = c.screenshot().await {
        let _ = std::fs::write(target_dir().join("dashboard.png"), png);
    }
    std::fs::write(go, "").map_err(|e| e.to_string())?;
    until("the job to succeed", || async {
        text_of(c, "#job-state").await.filter(|t| t == "succeeded")
    })
    .await?;
    until("a bar per attempt", || async {
        (count(c, "rect.gantt-bar.o-succeeded").await == tasks).then_some(())
    })
    .await?;
    until("the task graph", || async {
        (count(c, "#graph circle.n-done").await == tasks).then_some(())
    })
    .await?;

    // A task's log: stdout, then stderr.
    click(c, "tr.task-row[data-task=\"stitch\"]").await?;
    until("stitch's stdout", || async {
        text_of(c, "#log-out")
            .await
            .filter(|t| t.contains("stitched 8"))
    })
    .await?;
    click(c, "#log-stderr").await?;
    until("stitch's stderr", || async {
        text_of(c, "#log-out")
            .await
            .filter(|t| t.contains("a warning"))
    })
    .await?;

    // The pool's page: the ledger and the providers.
    click(c, "a[href=\"#/pool\"]").await?;
    until("the pool's page", || async {
        text_of(c, "h1").await.filter(|t| t == "Pool")
    })
    .await?;
    Ok(())
}

#[test]
fn the_dashboard_in_a_browser() {
    let Some(driver_bin) = find("chromedriver") else {
        assert!(
            std::env::var("FLOTILLA_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "FLOTILLA_REQUIRE_BROWSER=1 but chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipped: no chromedriver (apt-get install chromium chromium-driver)");
        return;
    };
    let opts = Opts {
        server_args: vec!["--http-listen".into(), "127.0.0.1:0".into()],
        ..Opts::default()
    };
    let c = Cluster::start_with(2, 2, opts);
    let http = c.http.unwrap();
    let go = c.job_dir().join("go");
    let tasks = 9;
    c.submit_toml(
        "shown.toml",
        r#"
name = "shown"
[[task]]
id = "tile"
array = "0..8"
cmd = ["sh", "-c", "if [ {i} -lt 4 ]; then sleep 0.3; else while [ ! -f go ]; do sleep 0.05; done; fi; echo tile {i}"]
[[task]]
id = "stitch"
after = ["tile"]
cmd = ["sh", "-c", "echo stitched 8 tiles; echo a warning >&2"]
"#,
    );
    let driver = start_driver(&driver_bin);
    let profile = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = browser(&driver, profile.path()).await;
        let r = session(&client, http, &c.token, &go, tasks).await;
        if r.is_err() {
            if let Ok(png) = client.screenshot().await {
                let path = target_dir().join("dashboard-failure.png");
                let _ = std::fs::write(&path, png);
                eprintln!("screenshot: {}", path.display());
            }
        }
        let _ = client.close().await;
        if let Err(e) = r {
            panic!("{e} (see target/dashboard-failure.png)");
        }
    });
}
