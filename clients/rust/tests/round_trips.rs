//! Round trips to PostgreSQL per request, counted on the wire: the layer's pool connects
//! through a TCP proxy that reads the frontend/backend protocol and counts the times the
//! client sends while it has no answer pending (every Query and Sync it sent was answered by a
//! ReadyForQuery). Messages sent before the previous ones were answered (pipelined) belong to
//! the same round trip. The proxy can also hold round trips back, to show that an answer
//! which writes nothing goes out before its ROLLBACK is done.
//!
//! The tests run on tokio's current-thread runtime: the layer's pipelined requests then reach
//! the socket in one write, as they do on an idle multi-thread runtime, and the count does
//! not depend on thread timing.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing;
use axum::Router;
use common::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pg_idempotency::{Idem, IdempotencyLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_postgres::types::Type;

#[derive(Default)]
struct Count {
    trips: usize,
    /// Round trips after this many wait until `release`.
    hold_after: Option<usize>,
    /// The SQL of every Parse and Query message, in order.
    statements: Vec<String>,
}

/// The counting proxy in front of DATABASE_URL's server.
struct Proxy {
    port: u16,
    count: Arc<Mutex<Count>>,
    released: watch::Sender<u64>,
}

impl Proxy {
    async fn start() -> Proxy {
        let pg: tokio_postgres::Config = database_url().parse().unwrap();
        let host = match &pg.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            other => panic!("DATABASE_URL must name a TCP host, not {other:?}"),
        };
        let port = pg.get_ports().first().copied().expect("DATABASE_URL must name its port");
        let target = format!("{host}:{port}");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(Mutex::new(Count::default()));
        let (released, _) = watch::channel(0);
        let proxy = Proxy { port, count: count.clone(), released: released.clone() };
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let server = TcpStream::connect(&target).await.unwrap();
                let (client_in, client_out) = client.into_split();
                let (server_in, server_out) = server.into_split();
                let pending = Arc::new(AtomicI64::new(0));
                tokio::spawn(frontend(
                    client_in,
                    server_out,
                    pending.clone(),
                    count.clone(),
                    released.subscribe(),
                ));
                tokio::spawn(backend(server_in, client_out, pending));
            }
        });
        proxy
    }

    /// Starts counting from zero; `hold_after`: let this many round trips through, hold the rest.
    fn reset(&self, hold_after: Option<usize>) {
        *self.count.lock().unwrap() = Count { trips: 0, hold_after, statements: Vec::new() };
    }

    fn trips(&self) -> usize {
        self.count.lock().unwrap().trips
    }

    /// The statements sent since the last reset that call idem_claim.
    fn claims(&self) -> Vec<String> {
        self.count.lock().unwrap().statements.iter().filter(|s| s.contains("idem_claim(")).cloned().collect()
    }

    fn release(&self) {
        self.count.lock().unwrap().hold_after = None;
        self.released.send_modify(|n| *n += 1);
    }

    /// `name`: the sessions' application_name.
    fn pool(&self, name: &str) -> Pool {
        let url: tokio_postgres::Config = database_url().parse().unwrap();
        let mut pg = tokio_postgres::Config::new();
        pg.host("127.0.0.1")
            .port(self.port)
            .user(url.get_user().unwrap_or("postgres"))
            .application_name(name);
        if let Some(db) = url.get_dbname() {
            pg.dbname(db);
        }
        if let Some(password) = url.get_password() {
            pg.password(password);
        }
        let manager = Manager::from_config(
            pg,
            tokio_postgres::NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        // One connection: every statement of a request goes through it, and a connection not
        // yet back in the pool blocks the next request.
        Pool::builder(manager).max_size(1).build().unwrap()
    }
}

/// The lengths of the complete messages at the start of `buf` (type byte + length, or an
/// untyped startup message while `started` is false).
fn next_message(buf: &[u8], started: bool) -> Option<(Option<u8>, usize)> {
    let (kind, at) = if started { (Some(*buf.first()?), 1) } else { (None, 0) };
    let len = u32::from_be_bytes(buf.get(at..at + 4)?.try_into().unwrap()) as usize;
    (buf.len() >= at + len).then_some((kind, at + len))
}

/// The SQL text of a Parse (name, then the query) or Query message.
fn statement(kind: u8, message: &[u8]) -> Option<String> {
    let body = message.get(5..)?;
    let text = match kind {
        b'Q' => body,
        b'P' => &body[body.iter().position(|&b| b == 0)? + 1..],
        _ => return None,
    };
    let end = text.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// Client to server: counts a round trip when the client sends with nothing pending.
async fn frontend(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pending: Arc<AtomicI64>,
    count: Arc<Mutex<Count>>,
    mut released: watch::Receiver<u64>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let (mut started, mut composing) = (false, false);
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        // Account for every complete message before forwarding any of them, so that no answer
        // can come back between two messages that arrived together.
        let mut ready = 0;
        while let Some((kind, len)) = next_message(&buf[ready..], started) {
            started = true;
            let Some(kind) = kind else {
                // The startup message: answered by a ReadyForQuery too.
                pending.fetch_add(1, Ordering::SeqCst);
                ready += len;
                continue;
            };
            let held = {
                let mut c = count.lock().unwrap();
                if let Some(sql) = statement(kind, &buf[ready..ready + len]) {
                    c.statements.push(sql);
                }
                let new_trip = pending.load(Ordering::SeqCst) == 0 && !composing && kind != b'X';
                if new_trip {
                    c.trips += 1;
                }
                new_trip && c.hold_after.is_some_and(|h| c.trips > h)
            };
            // Parse, Bind, Describe and Execute wait for their Sync: one trip with it.
            composing = kind != b'Q' && kind != b'S';
            if !composing {
                pending.fetch_add(1, Ordering::SeqCst);
            }
            if held {
                if to.write_all(&buf[..ready]).await.is_err() {
                    return;
                }
                buf.drain(..ready);
                ready = 0;
                while count.lock().unwrap().hold_after.is_some() {
                    if released.changed().await.is_err() {
                        return;
                    }
                }
            }
            ready += len;
        }
        if to.write_all(&buf[..ready]).await.is_err() {
            return;
        }
        buf.drain(..ready);
    }
}

/// Server to client: every ReadyForQuery answers one Query or Sync.
async fn backend(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, pending: Arc<AtomicI64>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut ready = 0;
        while let Some((kind, len)) = next_message(&buf[ready..], true) {
            if kind == Some(b'Z') {
                pending.fetch_sub(1, Ordering::SeqCst);
            }
            ready += len;
        }
        if to.write_all(&buf[..ready]).await.is_err() {
            return;
        }
        buf.drain(..ready);
    }
}

async fn serve(app: Router) -> u16 {
    let port = next_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// The handler: one INSERT into `table` on the claim's connection (its transaction); waits
/// while the body says so, to hold a committed-first claim in progress.
fn app(layer: IdempotencyLayer, gate: Arc<Notify>, table: &'static str) -> Router {
    let insert = format!("INSERT INTO {table} (key) VALUES ($1)");
    let handler = move |idem: Idem, body: String| {
        let (gate, insert) = (gate.clone(), insert.clone());
        async move {
            if body.contains("wait") {
                gate.notified().await;
            }
            let db = match idem.db().await {
                Ok(db) => db,
                Err(e) => return e.into_response(),
            };
            let key = idem.key().to_owned();
            match db.query_typed(&insert, &[(&key, Type::TEXT)]).await {
                Ok(_) => (StatusCode::CREATED, [("content-type", "application/json")], r#"{"ok": true}"#)
                    .into_response(),
                Err(e) => pg_idempotency::Error::from(e).into_response(),
            }
        }
    };
    Router::new().route("/items", routing::post(handler).layer(layer))
}

/// The proxy and a pool through it; `table` is the test's own (tests run in parallel), and the
/// pool's application_name.
async fn setup(table: &str) -> (Proxy, Pool) {
    let db = db().await;
    db.batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} (key text)")).await.unwrap();
    let proxy = Proxy::start().await;
    let pool = proxy.pool(table);
    (proxy, pool)
}

/// What another connection sees of the session `name` (the layer's one connection) while it
/// sits in a transaction: whether it holds a key lock (pg_locks `advisory`, objsubid 7649),
/// whether it has a transaction id (it has written something), and how many records of `key`
/// exist. None while the session is not idle in a transaction.
async fn seen_from_outside(
    other: &tokio_postgres::Client,
    name: &str,
    key: &str,
) -> Option<(bool, bool, i64)> {
    let sql = "SELECT EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
                                AND l.objsubid = 7649 AND l.granted),
                      a.backend_xid IS NOT NULL,
                      (SELECT count(*) FROM idempotency.keys WHERE key = $2)
               FROM pg_stat_activity a WHERE a.application_name = $1 AND a.state = 'idle in transaction'";
    let row = other.query_typed_opt(sql, &[(&name, Type::TEXT), (&key, Type::TEXT)]).await.unwrap()?;
    Some((row.get(0), row.get(1), row.get(2)))
}

/// Waits until the request's connection is back in the pool (after a ROLLBACK sent behind
/// the answer), so that the count is complete.
async fn idle(pool: &Pool) {
    for _ in 0..200 {
        let s = pool.status();
        if s.size == 1 && s.available == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the connection did not come back to the pool: {:?}", pool.status());
}

/// Sends one request, with the round trips after the first `hold_after` held; returns the
/// answer, which must come while they are held, and the round trips counted once they were
/// let through.
async fn counted(
    proxy: &Proxy,
    pool: &Pool,
    port: u16,
    key: &str,
    body: &str,
    hold_after: Option<usize>,
) -> (Resp, usize) {
    idle(pool).await;
    proxy.reset(hold_after);
    let answer =
        tokio::time::timeout(Duration::from_secs(10), post(port, "/items", "t", Some(key), body, &[]))
            .await
            .unwrap_or_else(|_| {
                panic!("no answer while the round trips after the first {hold_after:?} were held")
            });
    proxy.release();
    idle(pool).await;
    (answer, proxy.trips())
}

#[tokio::test]
async fn same_transaction_three_round_trips_and_one_before_a_writeless_answer() {
    let (proxy, pool) = setup("round_trips_same").await;
    let gate = Arc::new(Notify::new());
    let port = serve(app(IdempotencyLayer::new(pool.clone()), gate.clone(), "round_trips_same")).await;
    // Warm up: the pool's connection and the layer's one-time read of the features.
    let warm = post(port, "/items", "t", Some(&unique("warm")), "{}", &[]).await;
    assert_eq!(warm.status, 201, "{warm:?}");

    let key = unique("k");
    // BEGIN + claim, the handler's INSERT, idem_complete + COMMIT.
    let (fresh, trips) = counted(&proxy, &pool, port, &key, r#"{"n": 1}"#, None).await;
    assert_eq!(fresh.status, 201, "{fresh:?}");
    assert_eq!(trips, 3, "a fresh key: BEGIN with the claim, the INSERT, idem_complete with COMMIT");
    let deferred = pg_idempotency::client::features(&db().await).await.unwrap().claim_deferred;
    let claims = proxy.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].contains("deferred => true"), deferred, "same transaction: deferred where offered");

    // BEGIN + claim answers; the ROLLBACK (held by the proxy) comes after the answer.
    let (replay, trips) = counted(&proxy, &pool, port, &key, r#"{"n": 1}"#, Some(1)).await;
    assert!(replay.replayed() && replay.status == 201, "{replay:?}");
    assert_eq!(trips, 2, "a replay: BEGIN with the claim, then the ROLLBACK after the answer");

    let (mismatch, trips) = counted(&proxy, &pool, port, &key, r#"{"n": 2}"#, Some(1)).await;
    assert!(mismatch.is_problem(422), "{mismatch:?}");
    assert_eq!(trips, 2, "a mismatch: BEGIN with the claim, then the ROLLBACK after the answer");

    let rows: i64 = db()
        .await
        .query_typed_one("SELECT count(*) FROM round_trips_same WHERE key = $1", &[(&key, Type::TEXT)])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);

    // The claim is deferred (extension 0.6.0): while the handler runs (held at its start), the
    // key is held by its key lock alone. Seen from another connection: no record of the key,
    // and the claim's session has no transaction id, so it has written nothing (a claim that
    // writes its in_progress record at once has one). idem_complete then writes the record.
    let other = db().await;
    if !pg_idempotency::client::features(&other).await.unwrap().claim_deferred {
        skip("round_trips: the installed extension has no idem_claim(..., deferred) (0.6.0)");
        return;
    }
    let held = unique("k");
    let (h, p) = (held.clone(), port);
    let first = tokio::spawn(async move { post(p, "/items", "t", Some(&h), r#"{"wait": 1}"#, &[]).await });
    let seen = async {
        loop {
            match seen_from_outside(&other, "round_trips_same", &held).await {
                Some(seen @ (true, _, _)) => return seen,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    let (locked, has_xid, records) =
        tokio::time::timeout(Duration::from_secs(10), seen).await.expect("the claim holds its key lock");
    assert!(locked);
    assert_eq!((has_xid, records), (false, 0), "a deferred claim writes nothing before idem_complete");
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, 201);
    let status: String = other
        .query_typed_one("SELECT status::text FROM idempotency.keys WHERE key = $1", &[(&held, Type::TEXT)])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "completed", "idem_complete wrote the completed record");
}

#[tokio::test]
async fn committed_first_four_round_trips_and_one_for_a_writeless_answer() {
    let (proxy, pool) = setup("round_trips_first").await;
    let gate = Arc::new(Notify::new());
    let layer = IdempotencyLayer::new(pool.clone()).committed_first(Duration::from_secs(30));
    let port = serve(app(layer, gate.clone(), "round_trips_first")).await;
    let warm = post(port, "/items", "t", Some(&unique("warm")), "{}", &[]).await;
    assert_eq!(warm.status, 201, "{warm:?}");

    let key = unique("k");
    // The claim (committed at once), BEGIN + the fencing checkpoint, the INSERT,
    // idem_complete + COMMIT.
    let (fresh, trips) = counted(&proxy, &pool, port, &key, r#"{"n": 1}"#, None).await;
    assert_eq!(fresh.status, 201, "{fresh:?}");
    assert_eq!(
        trips, 4,
        "a fresh key: claim, BEGIN with the checkpoint, the INSERT, idem_complete with COMMIT"
    );
    let claims = proxy.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert!(!claims[0].contains("deferred"), "committed first: never deferred: {}", claims[0]);

    let (replay, trips) = counted(&proxy, &pool, port, &key, r#"{"n": 1}"#, Some(1)).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(trips, 1, "a replay: the claim alone");

    // A request that waits in its handler keeps its claim in progress: a duplicate is a 409.
    let busy = unique("k");
    let (b, p) = (busy.clone(), port);
    let first = tokio::spawn(async move { post(p, "/items", "t", Some(&b), r#"{"wait": 1}"#, &[]).await });
    let claimed = async {
        loop {
            let n: i64 = db()
                .await
                .query_typed_one(
                    "SELECT count(*) FROM idempotency.keys WHERE key = $1",
                    &[(&busy, Type::TEXT)],
                )
                .await
                .unwrap()
                .get(0);
            if n == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), claimed).await.expect("the first request claimed its key");
    let (conflict, trips) = counted(&proxy, &pool, port, &busy, r#"{"wait": 1}"#, Some(1)).await;
    assert!(conflict.is_problem(409), "{conflict:?}");
    assert_eq!(trips, 1, "in progress: the claim alone");
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, 201);
}
