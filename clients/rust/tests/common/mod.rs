//! Test helpers: the database (DATABASE_URL, a throwaway cluster started by test.sh), the demo
//! app as a real process, and a raw HTTP/1.1 client (so tests can send duplicated or
//! malformed header lines exactly as written).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::types::Type;

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL: a database with the idempotency extension (clients/rust/test.sh starts one)")
}

pub async fn db() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to DATABASE_URL");
    tokio::spawn(conn);
    client
}

/// Records an honest skip: test.sh counts these and does not count them as passed.
pub fn skip(why: &str) {
    eprintln!("SKIP: {why}");
    if let Ok(path) = std::env::var("SKIP_FILE") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{why}").unwrap();
    }
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// Ports from TEST_PORT_BASE (clients/rust/test.sh sets it from tests/lib.sh), one per server.
pub fn next_port() -> u16 {
    let base: u16 = std::env::var("TEST_PORT_BASE").ok().and_then(|p| p.parse().ok()).expect(
        "TEST_PORT_BASE: the demo apps' first port (clients/rust/test.sh sets it from tests/lib.sh's port table)",
    );
    base + NEXT_PORT.fetch_add(1, Ordering::SeqCst)
}

fn demo_bin() -> PathBuf {
    // target/<profile>/deps/<test binary> -> target/<profile>/examples/demo
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples").join("demo")
}

/// The demo app, killed when dropped.
pub struct Server {
    pub port: u16,
    child: Child,
}

impl Server {
    pub async fn start(lease_ms: u64) -> Server {
        Server::start_on(next_port(), lease_ms).await
    }

    pub async fn start_on(port: u16, lease_ms: u64) -> Server {
        let child = Command::new(demo_bin())
            .args(["--database-url", &database_url(), "--listen", &format!("127.0.0.1:{port}")])
            .args(["--lease-ms", &lease_ms.to_string(), "--allow-fault-injection", "--pool-size", "24"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {}: {e} (cargo test builds the example)", demo_bin().display())
            });
        let mut server = Server { port, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("the demo app exited with {status}");
            }
            if let Ok(r) = request(port, "GET", "/healthz", &[], b"").await {
                if r.status == 200 {
                    return server;
                }
            }
            assert!(Instant::now() < deadline, "the demo app did not come up on port {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// An RFC 9457 problem with this status.
    pub fn is_problem(&self, status: u16) -> bool {
        let p = self.json();
        self.status == status
            && self.header("content-type") == Some("application/problem+json")
            && p["status"] == status
            && p["type"].is_string()
            && p["title"].is_string()
    }
}

/// One request on its own connection (`Connection: close`); header lines sent as given.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    parse(&raw).ok_or_else(|| std::io::Error::other("no complete HTTP response"))
}

fn parse(raw: &[u8]) -> Option<Resp> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if let Some(len) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        body.truncate(len.1.parse().ok()?);
    }
    Some(Resp { status, headers, body })
}

/// POST a JSON body with a tenant and (quoted) key plus extra header lines.
pub async fn post(
    port: u16,
    path: &str,
    tenant: &str,
    key: Option<&str>,
    body: &str,
    extra: &[(&str, &str)],
) -> Resp {
    let quoted = key.map(|k| format!("\"{k}\""));
    let mut headers = vec![("X-Api-Key", tenant)];
    if let Some(q) = &quoted {
        headers.push(("Idempotency-Key", q.as_str()));
    }
    headers.extend_from_slice(extra);
    request(port, "POST", path, &headers, body.as_bytes()).await.expect("an HTTP answer")
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

pub async fn charges(db: &tokio_postgres::Client, tenant: &str) -> i64 {
    let sql = "SELECT count(*) FROM charges WHERE tenant = $1";
    db.query_typed_one(sql, &[(&tenant, Type::TEXT)]).await.unwrap().get(0)
}

pub async fn records(db: &tokio_postgres::Client, tenant: &str) -> i64 {
    let pattern = format!("{tenant}:%");
    let sql = "SELECT count(*) FROM idempotency.keys WHERE scope LIKE $1";
    db.query_typed_one(sql, &[(&pattern, Type::TEXT)]).await.unwrap().get(0)
}

/// An example program of this crate (cargo test builds them), by name.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples").join(name)
}

/// Where the example apps' logs go: test.sh's folder (RUST_SUITE_LOG_DIR), or a temporary one.
pub fn log_dir() -> PathBuf {
    let dir = std::env::var("RUST_SUITE_LOG_DIR").map(PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An example app as a real process, its output in a log file; killed when dropped.
pub struct App {
    pub port: u16,
    pub log: PathBuf,
    child: Child,
}

impl App {
    /// examples/orders.rs (the README's app), as its README says to run it: DATABASE_URL, LISTEN.
    pub async fn orders(database_url: &str) -> App {
        let port = next_port();
        let mut cmd = Command::new(example_bin("orders"));
        cmd.env("DATABASE_URL", database_url).env("LISTEN", format!("127.0.0.1:{port}"));
        App::start(cmd, "orders", port, "/orders").await
    }

    /// examples/demo.rs.
    pub async fn demo(database_url: &str, lease_ms: u64) -> App {
        let port = next_port();
        let mut cmd = Command::new(example_bin("demo"));
        cmd.args(["--database-url", database_url, "--listen", &format!("127.0.0.1:{port}")])
            .args(["--lease-ms", &lease_ms.to_string()])
            .env("RUST_LOG", "warn");
        App::start(cmd, "demo", port, "/healthz").await
    }

    async fn start(mut cmd: Command, name: &str, port: u16, probe: &str) -> App {
        let log = log_dir().join(format!("{name}-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting the example {name}: {e} (cargo test builds it)"));
        let mut app = App { port, log, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(app.alive(), "the example {name} exited; see {}", app.log.display());
            if request(port, "GET", probe, &[], b"").await.is_ok() {
                return app; // any answer: it listens
            }
            assert!(Instant::now() < deadline, "the example {name} did not answer on port {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Lines of the app's log that say it panicked.
    pub fn panics(&self) -> Vec<String> {
        self.log_lines("panicked")
    }

    /// Lines of the app's log at level ERROR (the layer logs every 500 it makes so).
    pub fn errors(&self) -> Vec<String> {
        self.log_lines("ERROR")
    }

    fn log_lines(&self, holding: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter(|l| l.contains(holding)).map(str::to_owned).collect()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// test.sh's second cluster, on its unix socket only, which tests stop and start again
/// (IDEM_RUST_OUTAGE_DIR, IDEM_RUST_OUTAGE_URL, IDEM_RUST_PGBIN). Tests that use it hold
/// [`OUTAGE`] (the tests of a binary run in parallel).
pub struct Outage {
    dir: String,
    pgbin: String,
    url: String,
}

pub static OUTAGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Outage {
    /// None (and a SKIP recorded) when test.sh did not start the cluster.
    pub fn get(test: &str) -> Option<Outage> {
        match (
            std::env::var("IDEM_RUST_OUTAGE_DIR"),
            std::env::var("IDEM_RUST_PGBIN"),
            std::env::var("IDEM_RUST_OUTAGE_URL"),
        ) {
            (Ok(dir), Ok(pgbin), Ok(url)) => Some(Outage { dir, pgbin, url }),
            _ => {
                skip(&format!("{test}: IDEM_RUST_OUTAGE_DIR is not set (clients/rust/test.sh starts the cluster it stops)"));
                None
            }
        }
    }

    /// pg_ctl on the cluster (as the postgres user when run as root), waiting for it.
    pub fn pg_ctl(&self, args: &[&str]) {
        let status = self.pg_ctl_command(args).status().expect("pg_ctl");
        assert!(status.success(), "pg_ctl {args:?} failed");
    }

    fn pg_ctl_command(&self, args: &[&str]) -> Command {
        use std::os::unix::fs::MetadataExt;
        let pg_ctl = format!("{}/pg_ctl", self.pgbin);
        let data = format!("{}/data", self.dir);
        let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &pg_ctl]);
            c
        } else {
            Command::new(&pg_ctl)
        };
        cmd.args(["-D", &data, "-w"]).args(args).current_dir("/").stdout(Stdio::null());
        cmd
    }

    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }

    pub fn start(&self) {
        let log = format!("{}/server.log", self.dir);
        self.pg_ctl(&["-l", &log, "start"]);
    }

    /// Starts the cluster unless it runs (`pg_ctl status` exits 3 when it is stopped).
    pub fn ensure_started(&self) {
        let status = self.pg_ctl_command(&["status"]).status();
        if status.map(|s| s.code() == Some(3)).unwrap_or(false) {
            self.start();
        }
    }

    pub fn restart(&self) {
        let log = format!("{}/server.log", self.dir);
        self.pg_ctl(&["-m", "fast", "-l", &log, "restart"]);
    }

    /// A fresh database `name` with the extension; its URL.
    pub async fn database(&self, name: &str) -> String {
        let (admin, conn) =
            tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.expect("the outage cluster");
        let task = tokio::spawn(conn);
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        drop(admin);
        let _ = task.await;
        let url = self.url.replacen("/postgres?", &format!("/{name}?"), 1);
        let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        let task = tokio::spawn(conn);
        db.batch_execute("CREATE EXTENSION idempotency").await.unwrap();
        drop(db);
        let _ = task.await;
        url
    }
}

/// A client of a database URL, its connection driven by a task of its own.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}
