//! The sender's worker outlives its database (issue 32), its timeout bounds a whole attempt, and
//! its own settings hold in its own transactions only: real servers, real sessions, real HTTP.
//! Its backends terminated (pg_terminate_backend), its server stopped and started again under
//! it (test.sh's outage cluster: connection refused meanwhile), a real deadlock, a
//! serialization failure: the worker logs each error (the `log` crate, target
//! pg_idempotency::sender), reconnects and goes on; the answer of an attempt in flight is
//! recorded after reconnecting while its lease holds, and is otherwise left to be taken again.
//! The tests of this file run one at a time (they share the outage cluster and the log).
#![cfg(feature = "reqwest")]

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use common::*;
use deadpool_postgres::{Manager, Pool};
use log::kv::Key;
use pg_idempotency::sender::{prepare, PrepareOptions, SendResult, Sender, LOG_TARGET};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, Notify};
use tokio_postgres::types::Type;

/// The application_name of the senders' sessions here: only they are terminated.
const APP: &str = "idem-sender-faults";

// --- the sender's log --------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Logged {
    level: log::Level,
    message: String,
    db_error: Option<String>,
    reconnected: bool,
}

struct Captured(Mutex<Vec<Logged>>);

impl log::Log for Captured {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.target() == LOG_TARGET
    }
    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let kv = r.key_values();
        self.0.lock().unwrap().push(Logged {
            level: r.level(),
            message: r.args().to_string(),
            db_error: kv.get(Key::from("db_error")).map(|v| v.to_string()),
            reconnected: kv.get(Key::from("db_reconnected")).is_some(),
        });
    }
    fn flush(&self) {}
}

/// The sender's records from now on (the log is the process's: tests here run one at a time).
fn capture() -> &'static Captured {
    static LOG: OnceLock<&'static Captured> = OnceLock::new();
    let captured = LOG.get_or_init(|| {
        let captured: &'static Captured = Box::leak(Box::new(Captured(Mutex::new(Vec::new()))));
        log::set_logger(captured).unwrap();
        log::set_max_level(log::LevelFilter::Info);
        captured
    });
    captured.0.lock().unwrap().clear();
    captured
}

impl Captured {
    fn db_errors(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().filter_map(|r| r.db_error.clone()).collect()
    }
    fn reconnections(&self) -> usize {
        self.0.lock().unwrap().iter().filter(|r| r.reconnected).count()
    }
    fn messages(&self) -> String {
        self.0.lock().unwrap().iter().map(|r| r.message.clone()).collect::<Vec<_>>().join("\n")
    }
    fn errors_are_warnings(&self) -> bool {
        self.0.lock().unwrap().iter().filter(|r| r.db_error.is_some()).all(|r| r.level == log::Level::Warn)
    }
}

// --- a receiver ---------------------------------------------------------------------------------

/// Answers 201 (or `status`), after `release` when it holds; logs every request's key.
struct Receiver {
    url: String,
    keys: Arc<Mutex<Vec<String>>>,
    arrived: Arc<Notify>,
    release: watch::Sender<bool>,
}

async fn receiver(status: u16, hold: bool) -> Receiver {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let arrived = Arc::new(Notify::new());
    let (release, released) = watch::channel(!hold);
    let (log, came) = (keys.clone(), arrived.clone());
    let app = Router::new().route(
        "/charges",
        post(move |headers: HeaderMap| {
            let (log, came, mut released) = (log.clone(), came.clone(), released.clone());
            async move {
                log.lock().unwrap().push(headers["idempotency-key"].to_str().unwrap().to_owned());
                came.notify_one();
                let _ = released.wait_for(|r| *r).await;
                (axum::http::StatusCode::from_u16(status).unwrap(), "{}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/charges", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver { url, keys, arrived, release }
}

impl Receiver {
    fn requests(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
    fn distinct_keys(&self) -> usize {
        let mut k = self.keys.lock().unwrap().clone();
        k.sort();
        k.dedup();
        k.len()
    }
}

// --- the sender and its database ---------------------------------------------------------------

fn config(url: &str) -> tokio_postgres::Config {
    let mut c: tokio_postgres::Config = url.parse().unwrap();
    c.application_name(APP);
    c
}

fn pool_of(url: &str) -> Pool {
    Pool::builder(Manager::new(config(url), tokio_postgres::NoTls)).max_size(8).build().unwrap()
}

/// Quick retries and reconnections: the sender's own settings, not the database's.
fn fast_sender(url: &str, receiver: &str, target: &str, lease: Duration, timeout: Duration) -> Sender {
    Sender::builder(pool_of(url))
        .listen(config(url))
        .url(target, receiver)
        .backoff_base(Duration::from_millis(50))
        .backoff_cap(Duration::from_millis(200))
        .reconnect(Duration::from_millis(50), Duration::from_millis(500))
        .poll_interval(Duration::from_millis(200))
        .lease(lease)
        .timeout(timeout)
        .build()
        .unwrap()
}

fn new_op(name: &str) -> String {
    unique(name) + ":charge"
}

async fn prepared(url: &str, op: &str, target: &str) {
    let mut db = connect(url).await;
    let tx = db.transaction().await.unwrap();
    prepare(&tx, "shop", op, target, Some(&json!({"amount": 1})), PrepareOptions::default()).await.unwrap();
    tx.commit().await.unwrap();
}

/// (state, attempts) of the send, from a session of its own (None: the server is down).
async fn state(url: &str, op: &str) -> Option<(String, i32)> {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(conn);
    let sql = "SELECT state::text, attempts FROM idempotency.outbound WHERE operation = $1";
    let row = db.query_typed_opt(sql, &[(&op, Type::TEXT)]).await.ok()??;
    Some((row.get(0), row.get(1)))
}

async fn wait_until_done(url: &str, op: &str) -> Option<(String, i32)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = state(url, op).await;
        if s.as_ref().is_some_and(|(st, _)| st == "done") || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sender::run in a task; `finish` stops it and checks that it ended only then.
struct Worker {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    fn start(sender: &Sender, target: &str) -> Worker {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (s, t) = (sender.clone(), target.to_owned());
        let task = tokio::spawn(async move {
            s.run(Some(&t), false, async move {
                let _ = stopped.await;
            })
            .await
        });
        Worker { stop: Some(stop), task }
    }

    fn alive(&self) -> bool {
        !self.task.is_finished()
    }

    async fn finish(mut self) {
        assert!(self.alive(), "the worker ended before its stop signal");
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(30), &mut self.task).await.expect("it stops").unwrap();
    }
}

async fn terminate(url: &str) -> i64 {
    let db = connect(url).await;
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1";
    db.query_typed_one(sql, &[(&APP, Type::TEXT)]).await.unwrap().get(0)
}

// --- the tests ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn backends_terminated_while_an_attempt_is_in_flight() {
    let _one_at_a_time = OUTAGE.lock().await;
    let log = capture();
    let url = database_url();
    let r = receiver(201, true).await;
    let (op, then, target) = (new_op("terminated"), new_op("terminated-then"), unique("t-terminated"));
    prepared(&url, &op, &target).await;
    let s = fast_sender(&url, &r.url, &target, Duration::from_secs(10), Duration::from_secs(5));
    let w = Worker::start(&s, &target);
    tokio::time::timeout(Duration::from_secs(20), r.arrived.notified()).await.expect("the attempt arrived");
    let terminated = terminate(&url).await;
    assert!(terminated >= 2, "its sessions: the pool's and LISTEN ({terminated})");
    r.release.send(true).unwrap();
    assert_eq!(wait_until_done(&url, &op).await.map(|s| s.0).as_deref(), Some("done"));
    prepared(&url, &then, &target).await; // and it goes on
    assert_eq!(wait_until_done(&url, &then).await.map(|s| s.0).as_deref(), Some("done"));
    w.finish().await;
    assert_eq!(state(&url, &op).await, Some(("done".into(), 1)), "recorded once, not taken again");
    assert_eq!(r.requests(), 2);
    let errors = log.db_errors();
    assert!(["57P01", "Closed"].contains(&errors.first().map_or("none", String::as_str)), "{errors:?}");
    assert!(log.reconnections() >= 1, "{}", log.messages());
    assert!(log.errors_are_warnings());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_restarted_under_the_worker_the_answer_recorded_after_reconnecting() {
    let _one_at_a_time = OUTAGE.lock().await;
    let Some(outage) = Outage::get("sender_faults: the server restarted under the worker") else { return };
    let log = capture();
    let url = outage.database("idem_rust_send_outage").await;
    let r = receiver(201, true).await;
    let (op, then, target) = (new_op("restart"), new_op("restart-then"), unique("t-restart"));
    prepared(&url, &op, &target).await;
    let s = fast_sender(&url, &r.url, &target, Duration::from_secs(10), Duration::from_secs(5));
    let w = Worker::start(&s, &target);
    tokio::time::timeout(Duration::from_secs(20), r.arrived.notified()).await.expect("the attempt arrived");
    outage.stop();
    {
        let _started_again = StartedAgain(&outage);
        r.release.send(true).unwrap(); // the answer comes while the server is down
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(w.alive(), "the worker lives while the server is down");
    }
    let while_down = log.db_errors();
    assert_eq!(wait_until_done(&url, &op).await, Some(("done".into(), 1)), "recorded, not taken again");
    prepared(&url, &then, &target).await;
    assert_eq!(wait_until_done(&url, &then).await.map(|s| s.0).as_deref(), Some("done"));
    w.finish().await;
    assert!(while_down.len() >= 2, "the shutdown and the refused connections after it: {while_down:?}");
    assert!(
        while_down.iter().any(|e| e == "ConnectionRefused" || e == "NotFound"),
        "no SQLSTATE: {while_down:?}"
    );
    assert!(log.reconnections() >= 1);
    let recorded = format!("recorded the answer to shop / {op} (attempt 1) after reconnecting");
    assert!(log.messages().contains(&recorded), "{}", log.messages());
    assert_eq!(r.requests(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn down_longer_than_the_lease_the_send_is_taken_again() {
    let _one_at_a_time = OUTAGE.lock().await;
    let Some(outage) = Outage::get("sender_faults: down longer than the lease") else { return };
    let log = capture();
    let url = outage.database("idem_rust_send_outage").await;
    let r = receiver(201, true).await;
    let (op, target) = (new_op("lease-ended"), unique("t-lease-ended"));
    prepared(&url, &op, &target).await;
    let s = fast_sender(&url, &r.url, &target, Duration::from_secs(2), Duration::from_millis(1500));
    let w = Worker::start(&s, &target);
    tokio::time::timeout(Duration::from_secs(20), r.arrived.notified()).await.expect("the attempt arrived");
    outage.stop();
    {
        let _started_again = StartedAgain(&outage);
        r.release.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    assert_eq!(
        wait_until_done(&url, &op).await,
        Some(("done".into(), 2)),
        "taken again once the lease ended"
    );
    w.finish().await;
    assert_eq!((r.requests(), r.distinct_keys()), (2, 1), "the same key twice");
    let dropped = format!("the answer to shop / {op} (attempt 1) was not recorded before its lease ended");
    assert!(log.messages().contains(&dropped), "{}", log.messages());
}

/// A BEFORE UPDATE trigger on idempotency.outbound for one target only (the sender's recording
/// of a result); dropped with the guard.
struct Trigger {
    url: String,
    name: String,
}

impl Trigger {
    async fn install(url: &str, target: &str, body: &str) -> Trigger {
        let name = format!("test_sender_{}", target.replace('-', "_"));
        let db = connect(url).await;
        db.batch_execute(&format!(
            "CREATE SEQUENCE public.{name}_seq;
             CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NEW; END $$;
             CREATE TRIGGER {name} BEFORE UPDATE ON idempotency.outbound FOR EACH ROW
               WHEN (NEW.target = '{target}' AND NEW.state <> 'sending') EXECUTE FUNCTION public.{name}()"
        ))
        .await
        .unwrap();
        Trigger { url: url.to_owned(), name }
    }

    async fn drop_it(self) {
        let n = &self.name;
        connect(&self.url)
            .await
            .batch_execute(&format!(
                "DROP TRIGGER {n} ON idempotency.outbound; DROP FUNCTION public.{n}(); DROP SEQUENCE public.{n}_seq"
            ))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_while_recording() {
    // A real deadlock: the sender's recording holds the send's row and waits for an advisory
    // lock (the trigger takes it) that another session holds, which then asks for the row.
    // PostgreSQL's deadlock detector aborts the sender's transaction (its deadlock_timeout, 1 s,
    // is the shorter); the worker logs 40P01, reconnects and records the answer.
    let _one_at_a_time = OUTAGE.lock().await;
    let log = capture();
    let url = database_url();
    let target = unique("t-deadlock").replace('_', "-");
    let trigger = Trigger::install(&url, &target, "PERFORM pg_advisory_xact_lock(4242);").await;
    let r = receiver(201, false).await;
    let op = new_op("deadlock");
    prepared(&url, &op, &target).await;
    let mut holder = connect(&url).await;
    let tx = holder.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL deadlock_timeout = '30s'; SELECT pg_advisory_xact_lock(4242)").await.unwrap();
    let s = fast_sender(&url, &r.url, &target, Duration::from_secs(20), Duration::from_secs(5));
    let w = Worker::start(&s, &target);
    let watcher = connect(&url).await;
    let waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'advisory'";
    let deadline = Instant::now() + Duration::from_secs(20);
    while watcher.query_typed_one(waiting, &[(&APP, Type::TEXT)]).await.unwrap().get::<_, i64>(0) != 1 {
        assert!(Instant::now() < deadline, "the sender's recording never waited for the advisory lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.query_typed(
        "SELECT 1 FROM idempotency.outbound WHERE operation = $1 FOR UPDATE",
        &[(&op, Type::TEXT)],
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let done = wait_until_done(&url, &op).await;
    w.finish().await;
    trigger.drop_it().await;
    assert_eq!(done, Some(("done".into(), 1)));
    assert!(log.db_errors().contains(&"40P01".to_owned()), "{:?}", log.db_errors());
    assert!(log.reconnections() >= 1);
    assert_eq!(r.requests(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_serialization_failure_while_recording() {
    // 40001, raised once by the trigger (the sender's READ COMMITTED transactions meet it from
    // functions of the application, e.g. on a table the trigger writes).
    let _one_at_a_time = OUTAGE.lock().await;
    let log = capture();
    let url = database_url();
    let target = unique("t-ser").replace('_', "-");
    let name = format!("test_sender_{}", target.replace('-', "_"));
    let body = format!(
        "IF nextval('public.{name}_seq') = 1 THEN RAISE EXCEPTION 'could not serialize access (this test)' \
         USING ERRCODE = 'serialization_failure'; END IF;"
    );
    let trigger = Trigger::install(&url, &target, &body).await;
    let r = receiver(201, false).await;
    let op = new_op("serialization");
    prepared(&url, &op, &target).await;
    let s = fast_sender(&url, &r.url, &target, Duration::from_secs(10), Duration::from_secs(5));
    let w = Worker::start(&s, &target);
    let done = wait_until_done(&url, &op).await;
    w.finish().await;
    trigger.drop_it().await;
    assert_eq!(done, Some(("done".into(), 1)));
    assert_eq!(log.db_errors(), vec!["40001".to_owned()]);
    assert_eq!(log.reconnections(), 1);
    assert_eq!(r.requests(), 1);
}

/// Starts the outage cluster when dropped, if it is down.
struct StartedAgain<'a>(&'a Outage);

impl Drop for StartedAgain<'_> {
    fn drop(&mut self) {
        self.0.ensure_started();
    }
}

// --- the timeout ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_trickling_answer_is_cut_by_the_timeout() {
    // The headers at once, then the body a byte every 200 ms (no socket read waits long enough
    // for a per-read timeout): the attempt ends at the sender's timeout (1 s), which closes
    // the connection, well before its lease (2 s) ends.
    let _one_at_a_time = OUTAGE.lock().await;
    let url = database_url();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver = format!("http://{}/charges", listener.local_addr().unwrap());
    let closed_after = Arc::new(Mutex::new(None::<Duration>));
    let seen = closed_after.clone();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await;
        let started = Instant::now();
        let head = "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n";
        socket.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if socket.write_all(b" ").await.is_err() {
                break;
            }
        }
        *seen.lock().unwrap() = Some(started.elapsed());
    });
    let (op, target) = (new_op("trickle"), unique("t-trickle"));
    prepared(&url, &op, &target).await;
    let s = Sender::builder(pool_of(&url))
        .url(&target, &receiver)
        .timeout(Duration::from_secs(1))
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let result = s.deliver("shop", &op).await.unwrap();
    let took = started.elapsed();
    let SendResult::NotYet { last_status: None, last_error: Some(e), .. } = &result else {
        panic!("{result:?}")
    };
    assert_eq!(e, "timed out");
    assert!(took < Duration::from_millis(1750), "the attempt took {took:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while closed_after.lock().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let closed = closed_after.lock().unwrap().expect("the sender closed the connection");
    assert!(closed < Duration::from_millis(1750), "closed after {closed:?}, the lease is 2 s");
}

// --- the sender's own settings ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn the_senders_give_up_after() {
    let _one_at_a_time = OUTAGE.lock().await;
    let url = database_url();
    let (op, other, target) = (new_op("give-up-90"), new_op("give-up-30"), unique("t-give-up"));
    let s = Sender::builder(pool_of(&url))
        .url(&target, "http://127.0.0.1:9/")
        .give_up_after(Duration::from_secs(90))
        .build()
        .unwrap();
    let mut db = connect(&url).await;
    let tx = db.transaction().await.unwrap();
    s.prepare(&tx, "shop", &op, &target, None, PrepareOptions::default()).await.unwrap();
    let thirty = PrepareOptions { give_up_after: Some(Duration::from_secs(30)), ..Default::default() };
    s.prepare(&tx, "shop", &other, &target, None, thirty).await.unwrap();
    tx.commit().await.unwrap();
    let sql = "SELECT extract(epoch FROM give_up_at - created_at)::float8 FROM idempotency.outbound WHERE operation = $1";
    for (op, secs) in [(&op, 90.0), (&other, 30.0)] {
        let got: f64 = db.query_typed_one(sql, &[(op, Type::TEXT)]).await.unwrap().get(0);
        assert_eq!(got, secs, "{op}");
    }
    for bad in [Duration::ZERO, Duration::from_secs(4_000_000 * 86_400)] {
        let refused =
            Sender::builder(pool_of(&url)).url(&target, "http://127.0.0.1:9/").give_up_after(bad).build();
        assert!(refused.is_err(), "{bad:?}");
    }
    let refused =
        Sender::builder(pool_of(&url)).url(&target, "http://127.0.0.1:9/").retry_budget(-1.0).build();
    assert!(refused.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn budget_and_backoff_of_the_sender_per_transaction_through_pgbouncer() {
    // Two senders through PgBouncer (transaction pooling) with their own budget and backoff: 12
    // first attempts answered 503; each retry due within the senders' cap (1 ms, where the
    // database's is far longer); the sender with budget 0 hands out no retry, the one with
    // budget 6 all 12 (floor((6 x 12 + 10) / 6) = 13 over the window's last sixth); and no other transaction sees their values (set_config(..., true)).
    let _one_at_a_time = OUTAGE.lock().await;
    let Ok(bounced) = std::env::var("IDEM_RUST_PGBOUNCER_URL") else {
        skip("sender_faults: IDEM_RUST_PGBOUNCER_URL is not set (clients/rust/test.sh starts PgBouncer and sets it)");
        return;
    };
    let url = database_url();
    let target = unique("t-budget");
    let ops: Vec<String> = (0..12).map(|i| new_op(&format!("budget-{i}"))).collect();
    for op in &ops {
        prepared(&url, op, &target).await;
    }
    let r = receiver(503, false).await;
    let tiny = Duration::from_millis(1);
    let sender = |budget: f64| {
        Sender::builder(pool_of(&bounced))
            .url(&target, &r.url)
            .timeout(Duration::from_secs(2))
            .lease(Duration::from_secs(5))
            .concurrency(50)
            .retry_budget(budget)
            .backoff_base(tiny)
            .backoff_cap(tiny)
            .build()
            .unwrap()
    };
    let (none, some) = (sender(0.0), sender(6.0));
    let db = connect(&url).await;
    let now = "SELECT extract(epoch FROM clock_timestamp())::float8";
    let before: f64 = db.query_typed_one(now, &[]).await.unwrap().get(0);
    assert_eq!(none.run_once(Some(&target)).await.unwrap(), 12, "first attempts are never held back");
    let after: f64 = db.query_typed_one(now, &[]).await.unwrap().get(0);
    let due_sql =
        "SELECT extract(epoch FROM next_attempt_at)::float8 FROM idempotency.outbound WHERE target = $1";
    let due: Vec<f64> = db
        .query_typed(due_sql, &[(&target, Type::TEXT)])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        due.len() == 12 && due.iter().all(|d| before <= *d && *d <= after + 0.001),
        "{before} {due:?} {after}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(none.run_once(Some(&target)).await.unwrap(), 0, "budget 0: no retries, though 12 are due");
    assert_eq!(
        some.run_once(Some(&target)).await.unwrap(),
        12,
        "budget 6: (6 x 12 first attempts + 10) / 6 >= 12"
    );
    assert_eq!(r.requests(), 24);
    let through = connect(&bounced).await;
    let shown = "SELECT coalesce(current_setting('idempotency.send_retry_budget', true), ''),
                        coalesce(current_setting('idempotency.send_backoff_cap', true), '')";
    for _ in 0..5 {
        let row = through.query_typed_one(shown, &[]).await.unwrap();
        let (budget, cap): (String, String) = (row.get(0), row.get(1));
        assert!(!["0", "1"].contains(&budget.as_str()) && cap != "0.001000 seconds", "{budget} {cap}");
    }
}
