//! The crate against contract/contract.json, the repository's one description of the contract:
//! its outcome words, its SQLSTATE map and every problem answer the middleware makes (type,
//! title, detail, status, Retry-After) are exactly the description's. No I/O.

use std::time::Duration;

use axum::body::to_bytes;
use axum::http::header;
use axum::response::Response;
use serde_json::{json, Value};

use crate::client::{Claim, Outcome};
use crate::error::BY_SQLSTATE;
use crate::key::KeyError;
use crate::layer::key_problem;
use crate::response::{in_progress, PROBLEMS, PROBLEM_TYPE_PREFIX, SUPERSEDED};
use crate::run::answer_without_work;
use crate::settings::REFUSED_STATUSES;

fn contract() -> Value {
    serde_json::from_str(include_str!("../../../contract/contract.json")).expect("contract.json parses")
}

fn described(slug: &str) -> Value {
    contract()["problems"].as_array().unwrap().iter().find(|p| p["slug"] == slug).cloned().unwrap()
}

fn body_of(r: Response) -> (u16, Option<String>, Option<String>, Value) {
    let status = r.status().as_u16();
    let text = |name| r.headers().get(name).map(|v: &axum::http::HeaderValue| v.to_str().unwrap().to_owned());
    let (ct, retry) = (text(header::CONTENT_TYPE), text(header::RETRY_AFTER));
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let bytes = rt.block_on(to_bytes(r.into_body(), usize::MAX)).unwrap();
    (status, ct, retry, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The answer is the description's problem `slug`, in everything it states.
fn assert_is_problem(r: Response, slug: &str) {
    let p = described(slug);
    let (status, ct, retry, body) = body_of(r);
    assert_eq!(status as u64, p["status"].as_u64().unwrap(), "{slug}: status");
    assert_eq!(ct.as_deref(), Some("application/problem+json"), "{slug}");
    let prefix = contract()["problem_type_prefix"].as_str().unwrap().to_owned();
    let want =
        json!({"type": prefix + slug, "title": p["title"], "status": p["status"], "detail": p["detail"]});
    assert_eq!(body, want, "{slug}: body");
    let listed = p["headers"].as_array().is_some_and(|h| h.iter().any(|h| h == "Retry-After"));
    assert_eq!(retry.is_some(), listed, "{slug}: Retry-After");
    if let Some(secs) = retry {
        assert!(secs.parse::<u64>().unwrap() >= 1, "{slug}: Retry-After {secs}");
    }
}

#[test]
fn the_crate_describes_the_contracts_problems_and_no_other() {
    assert_eq!(PROBLEM_TYPE_PREFIX, contract()["problem_type_prefix"]);
    let mut ours: Vec<&str> = PROBLEMS.iter().map(|p| p.slug).collect();
    let c = contract();
    let mut theirs: Vec<&str> =
        c["problems"].as_array().unwrap().iter().map(|p| p["slug"].as_str().unwrap()).collect();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs);
}

#[test]
fn every_problem_body_is_the_contracts() {
    for p in PROBLEMS {
        assert_is_problem(p.response(3), p.slug);
    }
}

fn claim(outcome: Outcome) -> Claim {
    Claim {
        outcome,
        token: None,
        http_status: None,
        response_status: Some(201),
        response_headers: Some(json!({"Content-Type": "application/json"})),
        response_body: Some(json!({"id": 1})),
        response_body_text: Some("{\"id\": 1}".into()),
        recovery_point: None,
        recovery_data: None,
        attempts: Some(1),
        expires_at: None,
        lease_left: Some(Duration::from_millis(2500)),
    }
}

#[test]
fn every_outcome_is_answered_as_the_contract_says() {
    let c = contract();
    let outcomes = c["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 6, "a new outcome: teach Outcome::parse and answer_without_work");
    for o in outcomes {
        let word = o["outcome"].as_str().unwrap();
        let outcome = Outcome::parse(word).unwrap_or_else(|| panic!("outcome {word} unknown to the crate"));
        match &o["http_status"] {
            Value::Null => assert!(outcome.owns(), "{word}: the handler runs"),
            Value::String(s) if s == "stored" => {
                let (status, _, _, body) = body_of(answer_without_work(&claim(outcome)));
                assert_eq!((status, body), (201, json!({"id": 1})), "{word}");
            }
            status => {
                let r = answer_without_work(&claim(outcome));
                assert_eq!(
                    r.status().as_u16() as u64,
                    status.as_u64().unwrap(),
                    "outcome {word}: HTTP status"
                );
                assert_is_problem(r, o["problem"].as_str().unwrap());
            }
        }
    }
}

#[test]
fn in_progress_retry_after_is_the_lease_left() {
    let r = answer_without_work(&claim(Outcome::InProgress));
    assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    assert_is_problem(in_progress(0), "idempotency-key-in-progress");
}

#[test]
fn key_refusals_and_a_lost_claim_are_the_contracts() {
    assert_is_problem(key_problem(&KeyError::Missing), "idempotency-key-missing");
    assert_is_problem(key_problem(&KeyError::Repeated), "idempotency-key-invalid");
    assert_is_problem(key_problem(&KeyError::Malformed("x".into())), "idempotency-key-invalid");
    assert_is_problem(SUPERSEDED.response(1), "idempotency-key-superseded");
}

#[test]
fn the_sqlstate_map_is_the_contracts() {
    let c = contract();
    let states = c["sqlstates"].as_array().unwrap();
    let ours: Vec<&str> = BY_SQLSTATE.iter().map(|(code, _)| *code).collect();
    for code in &ours {
        assert!(states.iter().any(|s| s["code"] == *code), "{code}: not in the description");
    }
    for s in states.iter().filter(|s| s["client"] == true) {
        let code = s["code"].as_str().unwrap();
        assert!(ours.contains(&code), "{code}: every client maps it, this crate does not");
    }
}

#[test]
fn the_refused_statuses_are_the_contracts() {
    let c = contract();
    let theirs: Vec<u16> = c["refused_statuses"]["statuses"]
        .as_array()
        .expect("refused_statuses.statuses")
        .iter()
        .map(|s| s.as_u64().unwrap() as u16)
        .collect();
    assert_eq!(REFUSED_STATUSES.to_vec(), theirs);
}
