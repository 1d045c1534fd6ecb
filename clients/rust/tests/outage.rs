//! The database restarted, stopped and started again under running apps: test.sh's second
//! cluster (IDEM_RUST_OUTAGE_DIR), which these tests stop and start with pg_ctl.
//!
//! The README's example app (examples/orders.rs, as it is) as a real process:
//! - restarted while the app is idle: the next requests succeed, the first one included (a
//!   pooled connection the server closed is dropped before anything is sent on it, and a claim
//!   whose connection turns out dead is sent again on another);
//! - stopped while the app is busy: every answer is 201 or the contract's 503
//!   (application/problem+json, `service-unavailable`, Retry-After), each 503 within 2 s (the
//!   layer's own bound on waiting for a connection), no other 5xx, no panic; every key answered
//!   201 has its one row and every key answered 503 none (503 says nothing was done); started
//!   again: requests succeed, the keys refused meanwhile included, once.
//!
//! And the demo app (both modes, and a route the layer does not protect): while the database is
//! down every answer is the 503 within 2 s; once it is back a key refused meanwhile runs once
//! and an earlier key replays.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio_postgres::types::Type;

/// The contract's "503 within 2 s".
const BOUND: Duration = Duration::from_secs(2);

fn is_unavailable(r: &Resp) -> bool {
    let retry_after = r.header("retry-after").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    r.is_problem(503)
        && r.json()["type"] == "urn:pg-idempotency:problem:service-unavailable"
        && retry_after >= 1
}

async fn order(app: &App, key: &str) -> Resp {
    let body = format!(r#"{{"item": "{key}", "quantity": 1}}"#);
    let send = post(app.port, "/orders", "t-outage", Some(key), &body, &[]);
    tokio::time::timeout(Duration::from_secs(30), send).await.expect("an answer within 30 s")
}

/// Repeats a request while it answers 503, as a client honouring Retry-After does.
async fn until_served<F, Fut>(call: F) -> Resp
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Resp>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call().await;
        if r.status != 503 || Instant::now() > deadline {
            return r;
        }
        assert!(is_unavailable(&r), "{r:?}");
        tokio::time::sleep(Duration::from_secs(r.header("retry-after").unwrap().parse().unwrap())).await;
    }
}

/// How many order rows each item (key) has.
async fn rows(url: &str, items: &[String]) -> Vec<i64> {
    let db = connect(url).await;
    let mut counts = Vec::new();
    for item in items {
        let sql = "SELECT count(*) FROM orders WHERE item = $1";
        counts.push(db.query_typed_one(sql, &[(item, Type::TEXT)]).await.unwrap().get(0));
    }
    counts
}

async fn concurrently(app: &App, n: usize) -> Vec<Resp> {
    let keys: Vec<String> = (0..n).map(|_| unique("k")).collect();
    futures_util::future::join_all(keys.iter().map(|k| order(app, k))).await
}

#[tokio::test(flavor = "multi_thread")]
async fn restarted_under_an_idle_app_no_503_the_first_request_included() {
    let _one_at_a_time = OUTAGE.lock().await;
    let Some(outage) = Outage::get("outage: restart under an idle app") else { return };
    let url = outage.database("idem_rust_outage_idle").await;
    let mut app = App::orders(&url).await;
    let warm = concurrently(&app, 16).await; // several connections in the pool, then idle
    assert!(warm.iter().all(|r| r.status == 201), "{:?}", warm.iter().find(|r| r.status != 201));
    outage.restart();
    let first = order(&app, &unique("k")).await;
    assert!(first.status == 201 && !first.replayed(), "the first request after the restart: {first:?}");
    let after = concurrently(&app, 32).await;
    let statuses: Vec<u16> = after.iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![201; 32], "{:?}", after.iter().find(|r| r.status != 201));
    assert!(app.alive());
    assert_eq!(app.panics(), Vec::<String>::new(), "{}", app.log.display());
    assert_eq!(app.errors(), Vec::<String>::new(), "{}", app.log.display());
}

/// Starts the cluster when dropped, if it is down (a test that failed midway leaves it up).
struct StartedAgain<'a>(&'a Outage);

impl Drop for StartedAgain<'_> {
    fn drop(&mut self) {
        self.0.ensure_started();
    }
}

struct Answered {
    key: String,
    reply: Resp,
    sent: Instant,
    took: Duration,
}

#[tokio::test(flavor = "multi_thread")]
async fn stopped_under_a_busy_app_only_503_within_the_bound_then_started() {
    let _one_at_a_time = OUTAGE.lock().await;
    let Some(outage) = Outage::get("outage: stop under a busy app") else { return };
    let url = outage.database("idem_rust_outage_busy").await;
    let mut app = App::orders(&url).await;
    let app_port = app.port;
    let answers: Arc<Mutex<Vec<Answered>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (answers, done) = (answers.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let (key, sent) = (unique("k"), Instant::now());
                    let body = format!(r#"{{"item": "{key}", "quantity": 1}}"#);
                    let reply = post(app_port, "/orders", "t-outage", Some(&key), &body, &[]).await;
                    answers.lock().unwrap().push(Answered { key, reply, sent, took: sent.elapsed() });
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    outage.stop();
    let _started_again = StartedAgain(&outage);
    let stopped_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        tokio::time::timeout(Duration::from_secs(60), c).await.expect("the clients end").unwrap();
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    outage.start();
    let odd: Vec<_> = answers
        .iter()
        .filter(|a| a.reply.status != 201 && !is_unavailable(&a.reply))
        .map(|a| (a.reply.status, String::from_utf8_lossy(&a.reply.body).into_owned()))
        .collect();
    assert!(
        odd.is_empty(),
        "201 or the 503 problem, nothing else: {odd:?}; the app's errors: {:?}",
        app.errors()
    );
    assert!(answers.iter().any(|a| a.sent > stopped_at), "no request after the stop");
    let slow: Vec<Duration> =
        answers.iter().filter(|a| a.reply.status == 503).map(|a| a.took).filter(|t| *t >= BOUND).collect();
    assert!(slow.is_empty(), "503s slower than {BOUND:?}: {slow:?}");
    assert!(app.alive(), "the app died; see {}", app.log.display());
    assert_eq!(app.panics(), Vec::<String>::new(), "{}", app.log.display());
    assert_eq!(app.errors(), Vec::<String>::new(), "{}", app.log.display());
    let app_ref = &app;
    let back = until_served(|| async move { order(app_ref, &unique("k")).await }).await;
    assert_eq!(back.status, 201, "{back:?}");
    let served: Vec<String> =
        answers.iter().filter(|a| a.reply.status == 201).map(|a| a.key.clone()).collect();
    assert!(rows(&url, &served).await.iter().all(|n| *n == 1), "a key answered 201 without its one row");
    let refused: Vec<String> =
        answers.iter().filter(|a| a.reply.status == 503).map(|a| a.key.clone()).collect();
    assert!(!refused.is_empty(), "no request was refused while the database was down");
    assert!(rows(&url, &refused).await.iter().all(|n| *n == 0), "a key answered 503 has a row");
    let retried: Vec<String> = refused.into_iter().take(10).collect();
    for key in &retried {
        let again = until_served(|| order(&app, key)).await;
        assert!(
            again.status == 201 && !again.replayed(),
            "a key refused meanwhile runs once back: {again:?}"
        );
    }
    assert!(rows(&url, &retried).await.iter().all(|n| *n == 1));
    println!(
        "outage: {} answers, {} of them 503 while the database was down",
        answers.len(),
        answers.iter().filter(|a| a.reply.status == 503).count()
    );
}

const CHARGE: &str = r#"{"amount": 700, "currency": "eur"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_app_down_503_within_the_bound_then_back_nothing_lost() {
    let _one_at_a_time = OUTAGE.lock().await;
    let Some(outage) = Outage::get("outage: the demo app") else { return };
    let url = outage.database("idem_rust_outage_demo").await;
    let app = App::demo(&url, 2000).await;
    let tenant = unique("acct_outage");
    let earlier_key = unique("k");
    let before = post(app.port, "/charges", &tenant, Some(&earlier_key), CHARGE, &[]).await;
    assert_eq!(before.status, 201, "{before:?}");
    let charge = before.header("location").unwrap().to_owned();
    let keys = [("/charges", unique("k")), ("/charges/external", unique("k"))];
    outage.stop();
    let _started_again = StartedAgain(&outage);
    let down = async {
        let mut seen = Vec::new();
        for (route, key) in &keys {
            let t = Instant::now();
            seen.push((*route, post(app.port, route, &tenant, Some(key), CHARGE, &[]).await, t.elapsed()));
        }
        let t = Instant::now();
        let got = request(app.port, "GET", &charge, &[("X-Api-Key", &tenant)], b"").await.unwrap();
        seen.push(("GET /charges/{id}", got, t.elapsed()));
        seen
    }
    .await;
    outage.start();
    for (what, r, took) in &down {
        assert!(is_unavailable(r) && *took < BOUND, "{what} with the database down: {r:?} in {took:?}");
    }
    for (route, key) in &keys {
        let first = until_served(|| post(app.port, route, &tenant, Some(key), CHARGE, &[])).await;
        assert!(first.status == 201 && !first.replayed(), "{route}: {first:?}");
        let again = post(app.port, route, &tenant, Some(key), CHARGE, &[]).await;
        assert!(again.replayed() && again.body == first.body, "{route}: {again:?}");
    }
    let earlier = post(app.port, "/charges", &tenant, Some(&earlier_key), CHARGE, &[]).await;
    assert!(earlier.replayed() && earlier.body == before.body, "{earlier:?}");
    assert_eq!(charges(&connect(&url).await, &tenant).await, 3);
    let got = until_served(|| async {
        request(app.port, "GET", &charge, &[("X-Api-Key", &tenant)], b"").await.unwrap()
    })
    .await;
    assert_eq!(got.status, 200, "{got:?}");
}
