//! The demo app (examples/demo.rs) as a real process over real HTTP against the real extension.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio_postgres::types::Type;

const ROUTES: [&str; 2] = ["/charges", "/charges/external"];
const BODY: &str = r#"{"amount": 500, "currency": "eur"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn bad_keys_are_400_before_any_claim_and_bare_uuids_are_keys() {
    let server = Server::start(2000).await;
    let db = db().await;
    let tenant = unique("acct_badkey");
    for route in ROUTES {
        let r = post(server.port, route, &tenant, None, BODY, &[]).await;
        assert!(r.is_problem(400), "missing key on {route}: {r:?}");
        for bad in ["\"abc", "a b", "a,b", "a\"b", "\"a\";p=1", "\"\"", &format!("\"{}\"", "k".repeat(256))] {
            let r = request(
                server.port,
                "POST",
                route,
                &[("X-Api-Key", &tenant), ("Idempotency-Key", bad)],
                BODY.as_bytes(),
            )
            .await
            .unwrap();
            assert!(r.is_problem(400), "key {bad:?} on {route}: {r:?}");
        }
        let two =
            [("X-Api-Key", tenant.as_str()), ("Idempotency-Key", "\"k1\""), ("Idempotency-Key", "\"k1\"")];
        let r = request(server.port, "POST", route, &two, BODY.as_bytes()).await.unwrap();
        assert!(r.is_problem(400), "duplicated key on {route}: {r:?}");
        let r = request(server.port, "POST", route, &[("Idempotency-Key", "\"k\"")], BODY.as_bytes())
            .await
            .unwrap();
        assert!(r.is_problem(401), "no tenant on {route}: {r:?}");
    }
    assert_eq!(records(&db, &tenant).await, 0, "nothing was claimed");
    assert_eq!(charges(&db, &tenant).await, 0);
    bare_keys(&server).await;
    what_hyper_hands_over(&server, &db).await;
}

/// What the README says of control characters, spaces and non-ASCII bytes in the key, as hyper
/// (axum's HTTP/1 server) really hands them over (on the test above's demo app).
async fn what_hyper_hands_over(server: &Server, db: &tokio_postgres::Client) {
    let tenant = unique("acct_hyper");
    let send = |key: &str| {
        let (tenant, key) = (tenant.clone(), key.to_owned());
        async move {
            let headers = [("X-Api-Key", tenant.as_str()), ("Idempotency-Key", key.as_str())];
            request(server.port, "POST", "/charges", &headers, BODY.as_bytes()).await.unwrap()
        }
    };
    // Control characters but the tab: hyper refuses the request itself (400, empty body).
    for key in ["\"a\u{0}b\"", "\"a\u{1}b\"", "a\u{1f}b", "\"a\u{7f}b\"", "a\u{7f}b"] {
        let r = send(key).await;
        assert_eq!((r.status, r.header("content-type"), r.body.len()), (400, None, 0), "{key:?}: {r:?}");
    }
    // A tab inside, or a byte that is not ASCII: the layer's 400 problem.
    for key in ["\"a\tb\"", "a\tb", "\"caf\u{e9}\"", "k\u{e9}"] {
        let r = send(key).await;
        assert!(r.is_problem(400), "{key:?}: {r:?}");
    }
    assert_eq!(records(db, &tenant).await, 0, "nothing was claimed");
    // Spaces and tabs around the value are not part of it; a space inside quotes is.
    let key = unique("k");
    let first = send(&format!(" \t\"{key}\"\t ")).await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let again = send(&format!("\"{key}\"")).await;
    assert!(again.replayed() && again.body == first.body, "{again:?}");
    let spaced = send(&format!("\"{key} b\"")).await;
    assert_eq!((spaced.status, spaced.replayed()), (201, false), "another key: {spaced:?}");
}

/// A bare UUID is a key, the same key as its quoted form (on the test above's demo app: a server
/// of its own would take a ninth port of the suite's eight, tests/lib.sh's rust-apps).
async fn bare_keys(server: &Server) {
    let tenant = unique("acct_bare");
    let bare = format!("1{}", &uuid::Uuid::new_v4().to_string()[1..]); // no RFC 8941 bare item
    for route in ROUTES {
        let send = |key: String| {
            let tenant = tenant.clone();
            async move {
                let headers = [("X-Api-Key", tenant.as_str()), ("Idempotency-Key", key.as_str())];
                request(server.port, "POST", route, &headers, BODY.as_bytes()).await.unwrap()
            }
        };
        let first = send(bare.clone()).await;
        assert_eq!((first.status, first.replayed()), (201, false), "bare {bare} on {route}: {first:?}");
        let quoted = send(format!("\"{bare}\"")).await;
        assert!(quoted.replayed() && quoted.body == first.body, "quoted {bare} on {route}: {quoted:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_is_byte_for_byte_with_the_stored_headers() {
    let server = Server::start(2000).await;
    let db = db().await;
    for route in ROUTES {
        let tenant = unique("acct_replay");
        let key = unique("k");
        let first = post(server.port, route, &tenant, Some(&key), BODY, &[]).await;
        assert_eq!(first.status, 201, "{first:?}");
        assert!(!first.replayed());
        assert!(first.header("location").unwrap().starts_with("/charges/ch_"));
        // The same JSON written differently is the same request (RFC 8785 fingerprint).
        let again =
            post(server.port, route, &tenant, Some(&key), r#"{"currency":"eur","amount":500.0}"#, &[]).await;
        assert_eq!(again.status, 201, "{again:?}");
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, first.body, "byte for byte");
        assert_eq!(again.header("location"), first.header("location"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        let got =
            request(server.port, "GET", first.header("location").unwrap(), &[("X-Api-Key", &tenant)], b"")
                .await
                .unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(got.json()["id"], first.json()["id"]);
        assert_eq!(charges(&db, &tenant).await, 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn another_body_with_the_key_is_422() {
    let server = Server::start(2000).await;
    let db = db().await;
    for route in ROUTES {
        let tenant = unique("acct_mismatch");
        let key = unique("k");
        assert_eq!(post(server.port, route, &tenant, Some(&key), BODY, &[]).await.status, 201);
        let other =
            post(server.port, route, &tenant, Some(&key), r#"{"amount": 501, "currency": "eur"}"#, &[]).await;
        assert!(other.is_problem(422), "{other:?}");
        assert_eq!(charges(&db, &tenant).await, 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_handler_gets_409_with_retry_after_from_the_lease() {
    let lease_ms = 2000;
    let server = Server::start(lease_ms).await;
    let tenant = unique("acct_slow");
    let key = unique("k");
    let port = server.port;
    let (t, k) = (tenant.clone(), key.clone());
    let slow = tokio::spawn(async move {
        post(port, "/charges/external", &t, Some(&k), BODY, &[("X-Fault-Delay-Ms", "3500")]).await
    });
    let db = db().await;
    wait_for_record(&db, &tenant).await;
    let dup = post(port, "/charges/external", &tenant, Some(&key), BODY, &[]).await;
    assert!(dup.is_problem(409), "{dup:?}");
    let retry_after: u64 = dup.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after} from a lease of {lease_ms} ms");
    // The handler outlives its lease: the renewals keep the claim.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let still = post(port, "/charges/external", &tenant, Some(&key), BODY, &[]).await;
    assert!(still.is_problem(409), "the lease was renewed: {still:?}");
    let first = slow.await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    let replay = post(port, "/charges/external", &tenant, Some(&key), BODY, &[]).await;
    assert!(replay.replayed() && replay.body == first.body, "{replay:?}");
    assert_eq!(charges(&db, &tenant).await, 1);
}

async fn wait_for_record(db: &tokio_postgres::Client, tenant: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while records(db, tenant).await == 0 {
        assert!(Instant::now() < deadline, "no claim appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn twelve_concurrent_identical_requests_make_one_charge() {
    let server = Server::start(2000).await;
    let db = db().await;
    for route in ROUTES {
        let tenant = unique("acct_conc");
        let key = unique("k");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(12));
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let (t, k, b, port) = (tenant.clone(), key.clone(), barrier.clone(), server.port);
                tokio::spawn(async move {
                    b.wait().await;
                    post(port, route, &t, Some(&k), BODY, &[("X-Fault-Delay-Ms", "300")]).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let firsts: Vec<_> = answers.iter().filter(|r| r.status == 201 && !r.replayed()).collect();
        assert_eq!(firsts.len(), 1, "{route}: {answers:?}");
        for r in &answers {
            match r.status {
                201 => assert_eq!(r.body, firsts[0].body, "{route}"),
                409 => assert!(r.is_problem(409) && r.header("retry-after").is_some(), "{r:?}"),
                _ => panic!("{route}: unexpected {r:?}"),
            }
        }
        assert_eq!(charges(&db, &tenant).await, 1, "{route}: one side effect");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_failing_before_its_side_effect_leaves_the_key_free() {
    let server = Server::start(2000).await;
    let db = db().await;
    for route in ROUTES {
        let tenant = unique("acct_fail");
        let key = unique("k");
        let failed =
            post(server.port, route, &tenant, Some(&key), BODY, &[("X-Fault-Fail-Before", "1")]).await;
        assert!(failed.is_problem(500), "{failed:?}");
        assert_eq!(records(&db, &tenant).await, 0, "{route}: released");
        // An invalid body is refused after the claim and gives the key back too.
        let bad = post(server.port, route, &tenant, Some(&key), r#"{"amount": -1}"#, &[]).await;
        assert!(bad.is_problem(400), "{bad:?}");
        let ok = post(server.port, route, &tenant, Some(&key), BODY, &[]).await;
        assert!(ok.status == 201 && !ok.replayed(), "{route}: runs as new: {ok:?}");
        assert_eq!(charges(&db, &tenant).await, 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_handler_is_completed_once_by_the_retry() {
    let lease_ms = 1000;
    let port = next_port();
    let mut server = Server::start_on(port, lease_ms).await;
    let db = db().await;
    let tenant = unique("acct_kill");
    let key = unique("k");
    let (t, k) = (tenant.clone(), key.clone());
    let doomed = tokio::spawn(async move {
        let headers = [
            ("X-Api-Key", t.as_str()),
            ("Idempotency-Key", &format!("\"{k}\"")),
            ("X-Fault-Delay-Ms", "30000"),
        ];
        request(port, "POST", "/charges/external", &headers, BODY.as_bytes()).await
    });
    wait_for_record(&db, &tenant).await;
    tokio::time::sleep(Duration::from_millis(lease_ms + 300)).await; // renewed past its first lease
    server.kill();
    assert!(doomed.await.unwrap().is_err(), "the killed request got no answer");
    let server = Server::start_on(next_port(), lease_ms).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut r, mut conflicts) =
        (post(server.port, "/charges/external", &tenant, Some(&key), BODY, &[]).await, 0);
    while r.status == 409 && Instant::now() < deadline {
        conflicts += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = post(server.port, "/charges/external", &tenant, Some(&key), BODY, &[]).await;
    }
    assert!(r.status == 201 && !r.replayed(), "after {conflicts} 409s: {r:?}");
    assert_eq!(charges(&db, &tenant).await, 1);
    let scope = format!("{tenant}:POST /charges/external");
    let row = db
        .query_typed_one(
            "SELECT status::text, attempts FROM idempotency.idem_lookup($1, $2)",
            &[(&scope, Type::TEXT), (&key, Type::TEXT)],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i32>(1)), ("completed".to_owned(), 2));
    let again = post(server.port, "/charges/external", &tenant, Some(&key), BODY, &[]).await;
    assert!(again.replayed() && again.body == r.body);
}
