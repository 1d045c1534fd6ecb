//! The typed client against the real extension.

mod common;

use std::time::Duration;

use common::*;
use pg_idempotency::client::{self, ClaimArgs, Fingerprint};
use pg_idempotency::{Error, Outcome};
use serde_json::json;

fn args<'a>(scope: &'a str, key: &'a str, fp: Fingerprint<'a>) -> ClaimArgs<'a> {
    ClaimArgs { scope, key, fingerprint: fp, lease: Some(Duration::from_secs(5)), ..Default::default() }
}

#[tokio::test]
async fn claim_complete_replay_and_mismatch() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    let (scope, key) = (unique("s"), unique("k"));
    let body = json!({"b": 1, "a": 2});
    let ignore = vec!["request_id".to_owned()];
    let c = client::claim(&db, f, &args(&scope, &key, Fingerprint::Json(&body, &ignore))).await.unwrap();
    assert_eq!(c.outcome, Outcome::Claimed);
    assert_eq!(c.attempts, Some(1));
    let lease = c.lease_left.unwrap();
    assert!(lease > Duration::from_secs(3) && lease <= Duration::from_secs(5), "{lease:?}");
    let token = c.token.unwrap();

    let dup = client::claim(&db, f, &args(&scope, &key, Fingerprint::Json(&body, &ignore))).await.unwrap();
    assert_eq!(dup.outcome, Outcome::InProgress);
    assert_eq!(dup.http_status, Some(409));
    assert!(dup.token.is_none());

    let stored = client::complete(
        &db,
        &scope,
        &key,
        token,
        201,
        Some(&json!({"id": "x", "n": 1.50})),
        Some(&json!({"Location": "/x"})),
    )
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), Some(r#"{"n": 1.5, "id": "x"}"#));

    // The same JSON written differently, with an ignored field: a replay.
    let same = json!({"a": 2.0, "b": 1, "request_id": "r2"});
    let r = client::claim(&db, f, &args(&scope, &key, Fingerprint::Json(&same, &ignore))).await.unwrap();
    assert_eq!(r.outcome, Outcome::Replay);
    assert_eq!((r.http_status, r.response_status), (Some(201), Some(201)));
    assert_eq!(r.response_body_text, stored);
    assert_eq!(r.response_headers, Some(json!({"Location": "/x"})));

    let other = json!({"a": 3, "b": 1});
    let m = client::claim(&db, f, &args(&scope, &key, Fingerprint::Json(&other, &ignore))).await.unwrap();
    assert_eq!((m.outcome, m.http_status), (Outcome::Mismatch, Some(422)));

    let fp = client::fingerprint_json(&db, &same, &["request_id"]).await.unwrap();
    let given = client::claim(&db, f, &args(&scope, &key, Fingerprint::Given(&fp))).await.unwrap();
    assert_eq!(given.outcome, Outcome::Replay, "the computed fingerprint equals the one the claim made");
}

#[tokio::test]
async fn checkpoint_release_lookup_and_the_ownership_errors() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    let (scope, key) = (unique("s"), unique("k"));
    let c = client::claim(&db, f, &args(&scope, &key, Fingerprint::None)).await.unwrap();
    let token = c.token.unwrap();
    let left = client::checkpoint(
        &db,
        &scope,
        &key,
        token,
        "step-1",
        Some(&json!({"n": 1})),
        Some(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    assert!(left > Duration::from_secs(55), "{left:?}");
    let rec = client::lookup(&db, &scope, &key).await.unwrap().unwrap();
    assert_eq!((rec.status.as_str(), rec.recovery_point.as_deref()), ("in_progress", Some("step-1")));
    assert_eq!(rec.recovery_data, Some(json!({"n": 1})));

    let stranger = uuid::Uuid::new_v4();
    let e = client::complete(&db, &scope, &key, stranger, 200, None, None).await.unwrap_err();
    assert!(matches!(e, Error::NotOwner(_)) && e.lost_claim() && e.sqlstate() == Some("IK002"), "{e:?}");
    assert!(!client::release(&db, &scope, &key, stranger).await.unwrap());
    assert!(client::release(&db, &scope, &key, token).await.unwrap());
    assert!(client::lookup(&db, &scope, &key).await.unwrap().is_none());
    let e = client::checkpoint(&db, &scope, &key, token, "p", None, None).await.unwrap_err();
    assert!(matches!(e, Error::NoRecord(_)), "{e:?}");

    let c = client::claim(&db, f, &args(&scope, &key, Fingerprint::None)).await.unwrap();
    assert_eq!(c.outcome, Outcome::Claimed, "a released key runs as new");
    let token = c.token.unwrap();
    client::complete(&db, &scope, &key, token, 200, None, None).await.unwrap();
    let e = client::complete(&db, &scope, &key, token, 200, None, None).await.unwrap_err();
    assert!(matches!(e, Error::AlreadyCompleted(_)), "{e:?}");
}

#[tokio::test]
async fn bad_arguments_map_to_typed_errors() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    let long = "k".repeat(256);
    let e = client::claim(&db, f, &args("s", &long, Fingerprint::None)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.sqlstate() == Some("22023"), "{e:?}");
    let e = client::claim(&db, f, &args("s", "", Fingerprint::None)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let (scope, key) = (unique("s"), unique("k"));
    let token = client::claim(&db, f, &args(&scope, &key, Fingerprint::None)).await.unwrap().token.unwrap();
    let e = client::complete(&db, &scope, &key, token, 99, None, None).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let zero = ClaimArgs { lease: Some(Duration::ZERO), ..args(&scope, "k2", Fingerprint::None) };
    let e = client::claim(&db, f, &zero).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "a zero lease: {e:?}");
}

#[tokio::test]
async fn takeover_after_the_lease_and_a_fenced_late_completion() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    let (scope, key) = (unique("s"), unique("k"));
    let short =
        ClaimArgs { lease: Some(Duration::from_millis(200)), ..args(&scope, &key, Fingerprint::None) };
    let first = client::claim(&db, f, &short).await.unwrap().token.unwrap();
    client::checkpoint(&db, &scope, &key, first, "half", None, Some(Duration::from_millis(200)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let c = client::claim(&db, f, &short).await.unwrap();
    assert_eq!(
        (c.outcome, c.attempts, c.recovery_point.as_deref()),
        (Outcome::Reclaimed, Some(2), Some("half"))
    );
    let e = client::complete(&db, &scope, &key, first, 201, None, None).await.unwrap_err();
    assert!(e.lost_claim(), "{e:?}");
    client::complete(&db, &scope, &key, c.token.unwrap(), 201, None, None).await.unwrap();
}

#[tokio::test]
async fn seen_and_seen_many() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    let scope = unique("consumer");
    assert!(client::seen(&db, &scope, "m1", None).await.unwrap());
    assert!(!client::seen(&db, &scope, "m1", None).await.unwrap());
    if !f.seen_many {
        let e = client::seen_many(&db, f, &scope, &["m1"], None).await.unwrap_err();
        assert!(matches!(e, Error::Unsupported("idem_seen_many")));
        skip("seen_many: the installed extension has no idem_seen_many (release 0.4.0 adds it)");
        return;
    }
    let got = client::seen_many(&db, f, &scope, &["m1", "m2", "m2", "m3"], None).await.unwrap();
    assert_eq!(got, vec![false, true, false, true]);
    assert!(client::seen_many(&db, f, &scope, &[], None).await.unwrap().is_empty());
}

#[tokio::test]
async fn wait_and_caller_token_when_the_extension_has_them() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    if !f.claim_wait_and_token {
        skip("claim wait/token: the installed extension's idem_claim has no wait and token arguments (release 0.4.0 adds them)");
        return;
    }
    let (scope, key) = (unique("s"), unique("k"));
    let token = uuid::Uuid::new_v4();
    let mine = ClaimArgs { token: Some(token), ..args(&scope, &key, Fingerprint::None) };
    let c = client::claim(&db, f, &mine).await.unwrap();
    assert_eq!((c.outcome, c.token), (Outcome::Claimed, Some(token)));
    let again = client::claim(&db, f, &mine).await.unwrap();
    assert_eq!(
        (again.outcome, again.token, again.attempts),
        (Outcome::Claimed, Some(token), Some(1)),
        "a retried claim"
    );
    // A waiting duplicate sees the completion.
    let db2 = common::db().await;
    let (s2, k2) = (scope.clone(), key.clone());
    let waiter = tokio::spawn(async move {
        let w = ClaimArgs { wait: Some(Duration::from_secs(5)), ..args(&s2, &k2, Fingerprint::None) };
        client::claim(&db2, f, &w).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    client::complete(&db, &scope, &key, token, 201, None, None).await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().outcome, Outcome::Replay);
}

#[tokio::test]
async fn expired_tombstones_when_the_extension_has_them() {
    let db = db().await;
    let f = client::features(&db).await.unwrap();
    // Tombstones came with wait and token (release 0.4.0).
    if !f.claim_wait_and_token {
        skip("expired: the installed extension has no idempotency.tombstone_ttl (release 0.4.0 adds it)");
        return;
    }
    let (scope, key) = (unique("s"), unique("k"));
    let short = ClaimArgs { ttl: Some(Duration::from_millis(300)), ..args(&scope, &key, Fingerprint::None) };
    let token = client::claim(&db, f, &short).await.unwrap().token.unwrap();
    client::complete(&db, &scope, &key, token, 201, None, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // SET LOCAL inside one transaction: behind PgBouncer in transaction mode a session's SET
    // may not reach the server connection that runs the next statement.
    db.batch_execute("BEGIN; SET LOCAL idempotency.tombstone_ttl = '1h'").await.unwrap();
    let c = client::claim(&db, f, &short).await.unwrap();
    db.batch_execute("COMMIT").await.unwrap();
    assert_eq!((c.outcome, c.http_status, c.response_status), (Outcome::Expired, Some(410), Some(201)));
}
