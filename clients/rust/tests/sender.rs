//! The sender (src/sender.rs) against the real extension and a real HTTP receiver (an axum
//! server in this process that answers from a script and logs every request's key).
#![cfg(feature = "reqwest")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use deadpool_postgres::{Manager, Pool};
use pg_idempotency::sender::{
    key_header, prepare, Answer, Attempt, BuildError, PrepareOptions, SendResult, SendState, Sender,
};
use pg_idempotency::Error;
use serde_json::json;

/// Answers the script's statuses in order (the last one from then on), with its headers.
struct Receiver {
    url: String,
    keys: Arc<Mutex<Vec<String>>>,
}

async fn receiver(script: Vec<(u16, Vec<(&'static str, &'static str)>)>) -> Receiver {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let log = keys.clone();
    let app = Router::new().route(
        "/charges",
        post(move |headers: HeaderMap| {
            let (log, script) = (log.clone(), script.clone());
            async move {
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(headers["idempotency-key"].to_str().unwrap().to_owned());
                    log.len()
                };
                let (status, extra) = &script[n.min(script.len()) - 1];
                let mut out = HeaderMap::new();
                for (name, value) in extra {
                    out.insert(*name, value.parse().unwrap());
                }
                (StatusCode::from_u16(*status).unwrap(), out, format!("{{\"n\": {n}}}"))
            }
        }),
    );
    // A port the kernel picks: this receiver lives in this process only.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/charges", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver { url, keys }
}

impl Receiver {
    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

fn pool() -> Pool {
    let config: tokio_postgres::Config = database_url().parse().unwrap();
    Pool::builder(Manager::new(config, tokio_postgres::NoTls)).max_size(4).build().unwrap()
}

/// Quick retries: the backoff settings of the sender's sessions.
fn quick_pool() -> Pool {
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.options("-c idempotency.send_backoff_base=50ms -c idempotency.send_backoff_cap=200ms");
    Pool::builder(Manager::new(config, tokio_postgres::NoTls)).max_size(4).build().unwrap()
}

async fn prepared(pool: &Pool, operation: &str, target: &str) -> String {
    let mut db = pool.get().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let p = prepare(&*tx, "shop", operation, target, Some(&json!({"amount": 1})), PrepareOptions::default())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    p.key
}

fn sender(pool: &Pool, target: &str, url: &str) -> Sender {
    Sender::builder(pool.clone())
        .url(target, url)
        .timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(100))
        .build()
        .unwrap()
}

#[tokio::test]
async fn prepare_is_part_of_the_transaction_and_keeps_the_key() {
    let pool = pool();
    let (op, target) = (unique("order"), unique("t"));
    let mut db = pool.get().await.unwrap();

    let tx = db.transaction().await.unwrap();
    let gone = prepare(&*tx, "shop", &op, &target, None, PrepareOptions::default()).await.unwrap();
    tx.rollback().await.unwrap();

    let key = prepared(&pool, &op, &target).await;
    assert_ne!(key, gone.key, "a rolled-back send's key is forgotten with it");
    let tx = db.transaction().await.unwrap();
    let again = prepare(&*tx, "shop", &op, &target, Some(&json!({"amount": 1})), PrepareOptions::default())
        .await
        .unwrap();
    assert_eq!((again.key.as_str(), again.state, again.attempts), (key.as_str(), SendState::Pending, 0));
    let other =
        prepare(&*tx, "shop", &op, &target, Some(&json!({"amount": 2})), PrepareOptions::default()).await;
    assert!(matches!(other, Err(Error::OperationReused(_))), "{other:?}");
    tx.rollback().await.unwrap();

    let mine = unique("k");
    let tx = db.transaction().await.unwrap();
    let given = prepare(
        &*tx,
        "shop",
        &unique("order"),
        &target,
        None,
        PrepareOptions { key: Some(&mine), ..Default::default() },
    )
    .await
    .unwrap();
    assert_eq!(given.key, mine);
    let bad = prepare(
        &*tx,
        "shop",
        &unique("order"),
        &target,
        None,
        PrepareOptions { key: Some(""), ..Default::default() },
    )
    .await;
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn deliver_sends_once_with_the_key_and_returns_the_answer() {
    let pool = pool();
    let r = receiver(vec![(201, vec![("location", "/charges/1")])]).await;
    let (op, target) = (unique("order"), unique("t"));
    let key = prepared(&pool, &op, &target).await;
    let s = sender(&pool, &target, &r.url);

    let SendResult::Delivered(d) = s.deliver("shop", &op).await.unwrap() else { panic!("not delivered") };
    assert_eq!((d.status, d.body.as_deref()), (201, Some(r#"{"n": 1}"#)));
    assert_eq!(d.headers.get("location").map(String::as_str), Some("/charges/1"));
    assert_eq!(r.keys(), vec![key_header(&key)]);

    // Delivered again: the stored answer, no second request.
    assert!(matches!(s.deliver("shop", &op).await.unwrap(), SendResult::Delivered(d) if d.status == 201));
    assert_eq!(r.keys().len(), 1);
    let mut db = pool.get().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let again = prepare(&*tx, "shop", &op, &target, Some(&json!({"amount": 1})), PrepareOptions::default())
        .await
        .unwrap();
    assert_eq!((again.state, again.response.map(|d| d.status)), (SendState::Done, Some(201)));
    tx.rollback().await.unwrap();
    let missing = s.deliver("shop", &unique("never")).await;
    assert!(matches!(missing, Err(Error::NoSend { .. })), "{missing:?}");
}

#[tokio::test]
async fn the_worker_retries_503_with_the_same_key_and_a_422_is_final() {
    let pool = quick_pool();
    let r = receiver(vec![(503, vec![]), (503, vec![]), (422, vec![])]).await;
    let (op, target) = (unique("order"), unique("t"));
    let key = prepared(&pool, &op, &target).await;
    let s = sender(&pool, &target, &r.url);

    let first = s.deliver("shop", &op).await.unwrap();
    assert!(
        matches!(
            first,
            SendResult::NotYet { state: SendState::Pending, attempts: 1, last_status: Some(503), .. }
        ),
        "{first:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), s.run(Some(&target), true, std::future::pending()))
        .await
        .expect("the worker ends when nothing is left");
    assert_eq!(r.keys(), vec![key_header(&key); 3]);
    let end = s.status("shop", &op).await.unwrap();
    assert!(matches!(end, Some(SendResult::Delivered(ref d)) if d.status == 422), "{end:?}");
}

#[tokio::test]
async fn retry_after_holds_the_retry_back_and_no_answer_is_retried() {
    let pool = quick_pool();
    let r = receiver(vec![(429, vec![("retry-after", "30")])]).await;
    let (op, target) = (unique("order"), unique("t"));
    prepared(&pool, &op, &target).await;
    let s = sender(&pool, &target, &r.url);
    let before = SystemTime::now();
    let SendResult::NotYet { next_attempt_at: Some(at), .. } = s.deliver("shop", &op).await.unwrap() else {
        panic!("not pending")
    };
    assert!(at.duration_since(before).unwrap() >= Duration::from_secs(29), "{at:?}");
    assert_eq!(s.run_once(Some(&target)).await.unwrap(), 0, "nothing is due before Retry-After");

    // A port where nothing listens: no answer, retried.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/charges", closed.local_addr().unwrap());
    drop(closed);
    let (op, target) = (unique("order"), unique("t"));
    prepared(&pool, &op, &target).await;
    let down = sender(&pool, &target, &url).deliver("shop", &op).await.unwrap();
    let SendResult::NotYet { state: SendState::Pending, last_status: None, last_error: Some(e), .. } = down
    else {
        panic!("{down:?}")
    };
    assert!(e.starts_with("connection failed"), "{e}");
}

#[tokio::test]
async fn no_final_answer_before_give_up_after_is_unknown() {
    let pool = quick_pool();
    let r = receiver(vec![(503, vec![])]).await;
    let (op, target) = (unique("order"), unique("t"));
    let mut db = pool.get().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let options = PrepareOptions { give_up_after: Some(Duration::from_millis(600)), ..Default::default() };
    let key = prepare(&*tx, "shop", &op, &target, None, options).await.unwrap().key;
    tx.commit().await.unwrap();
    let s = sender(&pool, &target, &r.url);
    tokio::time::timeout(Duration::from_secs(30), s.run(Some(&target), true, std::future::pending()))
        .await
        .expect("the worker ends");
    let end = s.status("shop", &op).await.unwrap();
    assert!(matches!(end, Some(SendResult::Unknown { key: ref k, .. }) if *k == key), "{end:?}");
    assert!(!r.keys().is_empty());
}

#[tokio::test]
async fn a_result_after_the_lease_was_taken_over_is_lost() {
    let pool = pool();
    let r = receiver(vec![(201, vec![])]).await;
    let (op, target) = (unique("order"), unique("t"));
    prepared(&pool, &op, &target).await;
    let db = pool.get().await.unwrap();
    let take = "SELECT token FROM idempotency.idem_send_next(scope => $1, operation => $2, lease => '200 milliseconds')";
    let stale: uuid::Uuid = db.query_one(take, &[&"shop", &op]).await.unwrap().get(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _fresh: uuid::Uuid = db.query_one(take, &[&"shop", &op]).await.unwrap().get(0);
    let result = "SELECT state FROM idempotency.idem_send_result($1, $2, $3, 201)";
    let late = db.query_one(result, &[&"shop", &op, &stale]).await.map_err(Error::from);
    assert!(matches!(late, Err(Error::NotOwner(_))), "{late:?}");
    // Through the sender: an attempt whose lease ended and was taken over by another sender
    // (its token stale) gets its answer reported as lost, not recorded.
    let (op, target) = (unique("order"), unique("t"));
    prepared(&pool, &op, &target).await;
    let take_all = |lease: &str| {
        format!(
            "SELECT scope, operation, target, key, request, attempt, token, locked_until, give_up_at
             FROM idempotency.idem_send_next(scope => 'shop', operation => $1, lease => '{lease}')"
        )
    };
    let row = db.query_one(&take_all("200 milliseconds"), &[&op]).await.unwrap();
    let stale = Attempt {
        scope: row.get("scope"),
        operation: row.get("operation"),
        target: row.get("target"),
        key: row.get("key"),
        request: row.get("request"),
        attempt: row.get("attempt"),
        token: row.get("token"),
        locked_until: row.get("locked_until"),
        give_up_at: row.get("give_up_at"),
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken_over = db.query_one(&take_all("1 minute"), &[&op]).await.unwrap();
    assert_ne!(taken_over.get::<_, uuid::Uuid>("token"), stale.token);
    let answering = Sender::builder(pool.clone())
        .send_with(|_| async { Answer::response(201, Default::default(), None) })
        .build()
        .unwrap();
    let late = answering.attempt(stale).await.unwrap();
    assert_eq!(late, SendResult::Lost { scope: "shop".into(), operation: op.clone() });
    let now = answering.status("shop", &op).await.unwrap();
    assert!(matches!(now, Some(SendResult::NotYet { state: SendState::Sending, .. })), "{now:?}");
    assert!(r.keys().is_empty(), "a send function of its own: the receiver saw nothing");
}

#[tokio::test]
async fn the_timeout_bounds_the_whole_attempt_and_must_be_below_the_lease() {
    let pool = pool();
    let refused = Sender::builder(pool.clone())
        .url("t", "http://127.0.0.1:9/")
        .timeout(Duration::from_millis(1500))
        .lease(Duration::from_millis(1500))
        .build();
    assert!(matches!(refused, Err(BuildError::TimeoutNotBelowLease(_))), "{:?}", refused.err());
    // A send function that would answer after 900 ms, with a timeout of 100 ms: no answer.
    let (op, target) = (unique("order"), unique("t"));
    prepared(&pool, &op, &target).await;
    let slow = Sender::builder(pool.clone())
        .send_with(|_| async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            Answer::response(201, Default::default(), None)
        })
        .timeout(Duration::from_millis(100))
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Instant::now();
    let result = slow.deliver("shop", &op).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(800), "{:?}", started.elapsed());
    let SendResult::NotYet { last_status: None, last_error: Some(e), .. } = result else {
        panic!("{result:?}")
    };
    assert_eq!(e, "timed out");
}

#[tokio::test]
async fn the_worker_wakes_on_notify_not_on_its_poll() {
    let pool = pool();
    let r = receiver(vec![(201, vec![])]).await;
    let target = unique("t");
    let s = Sender::builder(pool.clone())
        .listen(database_url().parse().unwrap())
        .url(&target, &r.url)
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = {
        let (s, target) = (s.clone(), target.clone());
        tokio::spawn(
            async move { s.run(Some(&target), false, async move { stop_rx.await.unwrap_or(()) }).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    prepared(&pool, &unique("order"), &target).await;
    while r.keys().is_empty() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(r.keys().len(), 1, "the worker did not wake up on the NOTIFY");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), worker).await.expect("it stops").unwrap();
}

/// Logs, in a table of its own, each result recorded for target's sends: the operation and the
/// transaction that recorded it. Returns the table's name.
async fn recordings(db: &tokio_postgres::Client, target: &str) -> String {
    let table = format!("public.{}", unique("test_rust_recorded").replace('-', "_"));
    let function = format!("{table}_log");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (n bigserial, xact xid8, operation text);
         CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {table} (xact, operation) VALUES (pg_current_xact_id(), NEW.operation); RETURN NEW; END $$;
         CREATE TRIGGER {} BEFORE UPDATE ON idempotency.outbound FOR EACH ROW
           WHEN (NEW.target = '{target}' AND NEW.state <> 'sending') EXECUTE FUNCTION {function}();",
        table.trim_start_matches("public.")
    ))
    .await
    .unwrap();
    table
}

/// The operations recorded (in order) and in how many transactions.
async fn recorded(db: &tokio_postgres::Client, table: &str) -> (Vec<String>, i64) {
    let ops = db.query(&format!("SELECT operation FROM {table} ORDER BY n"), &[]).await.unwrap();
    let xacts = db.query_one(&format!("SELECT count(DISTINCT xact) FROM {table}"), &[]).await.unwrap();
    (ops.iter().map(|r| r.get(0)).collect(), xacts.get(0))
}

/// A round of several sends has their answers recorded together: one statement, one
/// transaction, the rows in (scope, operation) order, under the sender's own settings (its
/// backoff); a round of one keeps the single call.
#[tokio::test]
async fn a_round_of_several_sends_is_recorded_together() {
    let pool = pool();
    let db = db().await;
    let (round, target) = (unique("round"), unique("t"));
    let table = recordings(&db, &target).await;
    let op = |name: &str| format!("{round}-{name}");
    let finished = Arc::new(Mutex::new(Vec::new()));
    let seen = finished.clone();
    let s = Sender::builder(pool.clone())
        .send_with(|a: Attempt| async move {
            let status = match a.operation.rsplit('-').next() {
                Some("a") => 503,
                Some("b") => 400,
                _ => 201,
            };
            Answer::response(status, Default::default(), None)
        })
        .concurrency(4)
        .backoff_base(Duration::from_millis(1))
        .backoff_cap(Duration::from_millis(1))
        .on_finished(move |a, _| seen.lock().unwrap().push(a.operation.clone()))
        .build()
        .unwrap();
    for name in ["c", "a", "b"] {
        prepared(&pool, &op(name), &target).await;
    }
    assert_eq!(s.run_once(Some(&target)).await.unwrap(), 3);
    assert_eq!(recorded(&db, &table).await, (vec![op("a"), op("b"), op("c")], 1));
    let a = s.status("shop", &op("a")).await.unwrap();
    assert!(
        matches!(
            a,
            Some(SendResult::NotYet { state: SendState::Pending, attempts: 1, last_status: Some(503), .. })
        ),
        "{a:?}"
    );
    let due = "SELECT next_attempt_at <= now() + interval '1 millisecond' FROM idempotency.outbound
               WHERE scope = 'shop' AND operation = $1";
    assert!(
        db.query_one(due, &[&op("a")]).await.unwrap().get::<_, bool>(0),
        "the retry within the sender's cap"
    );
    for (name, status) in [("b", 400), ("c", 201)] {
        let now = s.status("shop", &op(name)).await.unwrap();
        assert!(matches!(&now, Some(SendResult::Delivered(d)) if d.status == status), "{name}: {now:?}");
    }
    let mut done = finished.lock().unwrap().clone();
    done.sort();
    assert_eq!(done, vec![op("b"), op("c")]);

    // a's retry, due within the cap: a round of one.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.run_once(Some(&target)).await.unwrap(), 1);
    assert_eq!(recorded(&db, &table).await, (vec![op("a"), op("b"), op("c"), op("a")], 2));
}

/// When the extension refuses one answer of a round (IK002: the send is no longer held with
/// its token; IK003: recorded already) the statement records none of them, and each is
/// recorded on its own. Here b's send function has b's answer recorded from another session
/// first: a retryable one (so the row is pending again, its token gone: IK002) or a final one
/// (IK003, as when the reply to the sender's COMMIT was lost).
#[tokio::test]
async fn a_round_with_an_answer_refused_is_recorded_one_at_a_time() {
    for (refused, b_status) in [("IK002", 503), ("IK003", 202)] {
        let pool = pool();
        let db = db().await;
        let (round, target) = (unique("fallback"), unique("t"));
        let table = recordings(&db, &target).await;
        let op = |name: &str| format!("{round}-{name}");
        let beside = pool.clone();
        let s = Sender::builder(pool.clone())
            .send_with(move |a: Attempt| {
                let beside = beside.clone();
                async move {
                    if a.operation.ends_with("-b") {
                        let db = beside.get().await.unwrap();
                        db.query_one(
                            "SELECT idempotency.idem_send_result($1, $2, $3, $4, NULL, '{}'::jsonb)",
                            &[&a.scope, &a.operation, &a.token, &b_status],
                        )
                        .await
                        .unwrap();
                        return Answer::response(b_status as u16, Default::default(), None);
                    }
                    Answer::response(201, Default::default(), None)
                }
            })
            .concurrency(4)
            .build()
            .unwrap();
        for name in ["a", "b", "c"] {
            prepared(&pool, &op(name), &target).await;
        }
        assert_eq!(s.run_once(Some(&target)).await.unwrap(), 3, "{refused}");
        // b (from the other session), then a and c, each in its own transaction.
        assert_eq!(recorded(&db, &table).await, (vec![op("b"), op("a"), op("c")], 3), "{refused}");
        for name in ["a", "c"] {
            let now = s.status("shop", &op(name)).await.unwrap();
            assert!(
                matches!(&now, Some(SendResult::Delivered(d)) if d.status == 201),
                "{refused} {name}: {now:?}"
            );
        }
        let b = s.status("shop", &op("b")).await.unwrap();
        match refused {
            "IK002" => assert!(
                matches!(b, Some(SendResult::NotYet { state: SendState::Pending, attempts: 1, .. })),
                "{b:?}"
            ),
            _ => assert!(matches!(&b, Some(SendResult::Delivered(d)) if d.status == 202), "{b:?}"),
        }
    }
}
