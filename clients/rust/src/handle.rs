//! What a handler behind the layer receives: the [`Idem`] extractor, with the claim and the
//! database connection its writes must use.
//!
//! - Same-transaction routes: [`Idem::db`] is the open transaction in which the key was
//!   claimed; the layer stores the response with `idem_complete` in it and commits.
//! - Committed-first routes: the claim committed at once and its lease is renewed while the
//!   handler runs. [`Idem::db`] begins the handler's final transaction, fenced: it first runs
//!   `idem_checkpoint` with the claim's token there, which fails with IK002 if the claim was
//!   taken over, and otherwise locks the record until COMMIT, so nobody can take it over before
//!   the layer's `idem_complete` in that same transaction. A handler that never calls `db`
//!   gets its response stored in a transaction of its own.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use deadpool_postgres::{Object, Pool};
use futures_util::future::join;
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard};
use uuid::Uuid;

use crate::client::{self, Outcome};
use crate::error::Error;
use crate::pool;
use crate::response::{in_progress, INTERNAL_ERROR, SERVICE_UNAVAILABLE, SUPERSEDED};

/// The recovery point sent by lease renewals before the handler's first checkpoint
/// (`idem_checkpoint` requires one); read back as "no checkpoint".
pub(crate) const NO_CHECKPOINT: &str = "";

/// What a handler may do with the claim (set as a response extension): overrides the layer's
/// default (store responses below 500, and 5xx as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Store the response with `idem_complete`: retries replay it.
    Store,
    /// Nothing was done: release the claim (same transaction: roll back); a retry runs as new.
    Release,
    /// Committed first only: neither store nor release. The claim stays until its lease ends
    /// and a retry takes it over (for "the outcome of the side effect is unknown").
    Keep,
}

impl Disposition {
    /// Marks a response.
    pub fn mark(self, mut response: Response) -> Response {
        response.extensions_mut().insert(self);
        response
    }
}

pub(crate) struct Shared {
    pub scope: String,
    pub key: String,
    pub token: Uuid,
    pub outcome: Outcome,
    pub attempts: i32,
    pub committed_first: bool,
    pub pool: Pool,
    /// How long to wait for a live connection of `pool`.
    pub connection_timeout: Duration,
    pub lease: Duration,
    /// The last checkpoint: (recovery_point, recovery_data).
    pub progress: StdMutex<(Option<String>, Option<Value>)>,
    pub renewing: AtomicBool,
    /// The connection the handler writes on (same transaction: the claim's).
    pub conn: Arc<Mutex<Option<Object>>>,
    pub tx_begun: AtomicBool,
}

/// The claim a handler runs under (an axum extractor; present only behind the layer).
#[derive(Clone)]
pub struct Idem(pub(crate) Arc<Shared>);

impl Idem {
    pub fn scope(&self) -> &str {
        &self.0.scope
    }
    pub fn key(&self) -> &str {
        &self.0.key
    }
    pub fn token(&self) -> Uuid {
        self.0.token
    }
    /// `Claimed`, or `Reclaimed` when an earlier attempt's lease ended: resume from
    /// [`Idem::recovery_point`].
    pub fn outcome(&self) -> Outcome {
        self.0.outcome
    }
    pub fn attempts(&self) -> i32 {
        self.0.attempts
    }
    pub fn recovery_point(&self) -> Option<String> {
        self.0.progress.lock().unwrap().0.clone()
    }
    pub fn recovery_data(&self) -> Option<Value> {
        self.0.progress.lock().unwrap().1.clone()
    }

    /// Records progress (`idem_checkpoint`, which also renews the lease); later renewals keep it.
    pub async fn checkpoint(&self, point: &str, data: Option<Value>) -> Result<(), Error> {
        let s = &self.0;
        // Once the handler's final transaction has begun it holds the record's row lock: the
        // checkpoint goes into that transaction (from another connection it would wait on it).
        if s.committed_first && !s.tx_begun.load(Ordering::SeqCst) {
            let conn = pool::live_within(&s.pool, s.connection_timeout).await?;
            client::checkpoint(&**conn, &s.scope, &s.key, s.token, point, data.as_ref(), Some(s.lease))
                .await?;
        } else {
            let db = self.db().await?;
            client::checkpoint(&*db, &s.scope, &s.key, s.token, point, data.as_ref(), None).await?;
        }
        *s.progress.lock().unwrap() = (Some(point.to_owned()), data);
        Ok(())
    }

    /// Stops renewing the lease: the claim is taken over by a retry once it ends (tests use
    /// this to play a worker that hangs).
    pub fn stop_renewal(&self) {
        self.0.renewing.store(false, Ordering::SeqCst);
    }

    /// The connection for the handler's writes, inside the transaction the layer commits
    /// together with the stored response (see the module documentation).
    pub async fn db(&self) -> Result<Db, Error> {
        let s = &self.0;
        let mut guard = s.conn.clone().lock_owned().await;
        if guard.is_none() {
            if !s.committed_first || s.tx_begun.load(Ordering::SeqCst) {
                return Err(Error::Unsupported("Idem::db after the handler finished"));
            }
            let conn = pool::live_within(&s.pool, s.connection_timeout).await?;
            s.tx_begun.store(true, Ordering::SeqCst);
            // No renewal from now on: the fencing checkpoint below holds the record's row lock
            // until COMMIT, a renewal would only wait for it.
            s.renewing.store(false, Ordering::SeqCst);
            let (point, data) = s.progress.lock().unwrap().clone();
            let point = point.unwrap_or_else(|| NO_CHECKPOINT.to_owned());
            *guard = Some(conn);
            let db = guard.as_ref().expect("just set");
            // BEGIN and the fencing checkpoint in one round trip (pipelined: both are sent
            // before either answer is read).
            let (begun, fenced) = join(
                db.batch_execute("BEGIN"),
                client::checkpoint(&***db, &s.scope, &s.key, s.token, &point, data.as_ref(), Some(s.lease)),
            )
            .await;
            begun?;
            fenced?;
        }
        Ok(Db(guard))
    }
}

/// The handler's connection, in its transaction (derefs to `tokio_postgres::Client`; no
/// `&mut`, so no nested `transaction()`: the layer commits). Use `query_typed` /
/// `batch_execute` behind PgBouncer in transaction mode (see the README).
pub struct Db(OwnedMutexGuard<Option<Object>>);

impl Deref for Db {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &tokio_postgres::Client {
        self.0.as_ref().expect("the connection is there while the handler runs")
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Idem {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Idem>().cloned().ok_or_else(|| {
            log::error!("pg-idempotency: an Idem extractor on a route without IdempotencyLayer");
            INTERNAL_ERROR.response(1)
        })
    }
}

/// A handler may return `Result<_, Error>`: a lost claim (IK001/IK002) answers 409 and keeps
/// the claim for its new owner; 40001 / 55P03 answer 409 (retry); the database unreachable
/// answers 503 with Retry-After (the claim kept); anything else 500.
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if self.lost_claim() {
            log::warn!("pg-idempotency: the handler lost its claim: {self}");
            return Disposition::Keep.mark(SUPERSEDED.response(1));
        }
        if self.retryable() {
            return Disposition::Release.mark(in_progress(1));
        }
        if self.unavailable() {
            // The handler's transaction is gone with its connection; a side effect it made before
            // is resumed by a retry that takes the claim over (committed first).
            log::warn!("pg-idempotency: the database is unavailable: {self}");
            return Disposition::Keep.mark(SERVICE_UNAVAILABLE.response(1));
        }
        log::error!("pg-idempotency: {self}");
        INTERNAL_ERROR.response(1)
    }
}
