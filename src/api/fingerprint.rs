//! idem_fingerprint: request fingerprints, 'sha256:' || hex.

use pgrx::prelude::*;

use crate::errors::{IdemError, OrRaise};
use crate::jcs;
use crate::jsonb::Jsonb;

/// The sha256 of the payload's RFC 8785 canonical JSON, leaving out the top-level keys in
/// `ignore`. NULL for a NULL payload, as sha256(NULL) is.
#[pg_extern(immutable, parallel_safe)]
fn idem_fingerprint(
    payload: Option<Jsonb>,
    ignore: default!(Option<Vec<Option<String>>>, "NULL"),
) -> Option<String> {
    fingerprint_jsonb(payload, ignore).or_raise()
}

/// The sha256 of the bytes as they are.
#[pg_extern(name = "idem_fingerprint", immutable, parallel_safe, strict)]
fn idem_fingerprint_bytea(payload: &[u8]) -> String {
    jcs::sha256_tagged(payload)
}

fn fingerprint_jsonb(
    payload: Option<Jsonb>,
    ignore: Option<Vec<Option<String>>>,
) -> Result<Option<String>, IdemError> {
    let Some(payload) = payload else { return Ok(None) };
    let ignore: Vec<String> = ignore.unwrap_or_default().into_iter().flatten().collect();
    let ignore: Vec<&str> = ignore.iter().map(String::as_str).collect();
    payload.fingerprint(&ignore).map(Some).map_err(|e| IdemError::invalid("payload", e.to_string()))
}
