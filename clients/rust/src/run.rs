//! Running a request under its claim, in each mode: the claim, the handler in a task of its
//! own, then storing, releasing or keeping the claim by the response's disposition.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::response::Response;
use deadpool_postgres::Object;
use futures_util::future::join;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tower_service::Service;

use crate::client::{self, Claim, ClaimArgs, Features, Fingerprint, Outcome};
use crate::error::Error;
use crate::handle::{Disposition, Idem, Shared, NO_CHECKPOINT};
use crate::pool;
use crate::response::{
    body_bytes, from_stored, in_progress, to_stored, Stored, EXPIRED, INTERNAL_ERROR, REUSED,
    SERVICE_UNAVAILABLE, SUPERSEDED,
};
use crate::settings::{Mode, OnServerError, Settings};

/// The answer to an error met before the handler ran (nothing was done): 503 when the
/// database is unreachable, 409 when a retry may succeed, else 500.
pub(crate) fn error_response(what: &str, e: &Error) -> Response {
    if e.unavailable() {
        log::warn!("pg-idempotency: {what}: the database is unavailable: {e}");
        return SERVICE_UNAVAILABLE.response(1);
    }
    error_after_work(what, e)
}

/// The answer to an error met after the handler ran: never 503, whose "nothing was done" may
/// be untrue there (a COMMIT whose reply was lost).
fn error_after_work(what: &str, e: &Error) -> Response {
    if e.retryable() {
        return in_progress(1);
    }
    log::error!("pg-idempotency: {what}: {e}");
    INTERNAL_ERROR.response(1)
}

/// The answers to `replay`, `in_progress`, `mismatch` and `expired`: the handler does not run.
pub(crate) fn answer_without_work(c: &Claim) -> Response {
    match c.outcome {
        Outcome::Replay => {
            let headers = c.response_headers.clone().unwrap_or(Value::Null);
            let body = body_bytes(&headers, c.response_body.as_ref(), c.response_body_text.as_deref());
            from_stored(c.response_status.unwrap_or(500), &headers, body, true)
        }
        Outcome::InProgress => in_progress(c.lease_left.map_or(1, |d| d.as_secs_f64().ceil() as u64)),
        Outcome::Mismatch => REUSED.response(1),
        Outcome::Expired => EXPIRED.response(1),
        Outcome::Claimed | Outcome::Reclaimed => unreachable!("the caller owns the claim"),
    }
}

pub(crate) struct Claiming<'a> {
    pub(crate) cfg: &'a Settings,
    pub(crate) features: Features,
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) body: Bytes,
    /// When the request stops waiting for connections before its claim is answered (503).
    pub(crate) deadline: Instant,
}

impl Claiming<'_> {
    /// `deferred`: same transaction (the claim, the work and `idem_complete` commit together).
    async fn claim(
        &self,
        db: &tokio_postgres::Client,
        lease: Option<Duration>,
        token: uuid::Uuid,
        deferred: bool,
    ) -> Result<Claim, Error> {
        let json: Option<Value> = serde_json::from_slice(&self.body).ok();
        let fingerprint = match &json {
            Some(v) => Fingerprint::Json(v, &self.cfg.ignore),
            None => Fingerprint::Bytes(&self.body),
        };
        let args = ClaimArgs {
            scope: &self.scope,
            key: &self.key,
            fingerprint,
            ttl: self.cfg.ttl,
            lease,
            wait: self.cfg.wait,
            token: Some(token),
            deferred,
        };
        let c = client::claim(db, self.features, &args).await?;
        log::info!("pg-idempotency: {} key={:?} outcome={:?}", self.scope, self.key, c.outcome);
        Ok(c)
    }

    fn shared(&self, claim: &Claim, conn: Option<Object>) -> Arc<Shared> {
        let point = claim.recovery_point.clone().filter(|p| p != NO_CHECKPOINT);
        Arc::new(Shared {
            scope: self.scope.clone(),
            key: self.key.clone(),
            token: claim.token.expect("an owned claim has a token"),
            outcome: claim.outcome,
            attempts: claim.attempts.unwrap_or(1),
            committed_first: self.cfg.mode == Mode::CommittedFirst,
            pool: self.cfg.pool.clone(),
            connection_timeout: self.cfg.connection_timeout,
            lease: self.cfg.lease,
            progress: StdMutex::new((point, claim.recovery_data.clone())),
            renewing: AtomicBool::new(true),
            conn: Arc::new(Mutex::new(conn)),
            tx_begun: AtomicBool::new(false),
        })
    }

    /// What to do with the handler's response.
    fn disposition(&self, r: &Response) -> Disposition {
        if let Some(d) = r.extensions().get::<Disposition>() {
            return *d;
        }
        if self.cfg.refused_statuses.contains(&r.status().as_u16()) {
            return Disposition::Release;
        }
        match (r.status().is_server_error(), self.cfg.on_server_error) {
            (false, _) | (true, OnServerError::Store) => Disposition::Store,
            (true, OnServerError::Release) => Disposition::Release,
        }
    }
}

/// Runs the handler in a task of its own, so that a panic becomes a 500.
async fn run_handler<S>(mut inner: S, parts: Parts, body: Bytes, idem: Idem) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let mut req = Request::from_parts(parts, Body::from(body));
    req.extensions_mut().insert(idem);
    if let Err(never) = std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        match never {}
    }
    let fut = inner.call(req);
    match tokio::spawn(fut).await {
        Ok(Ok(r)) => r,
        Err(e) => {
            log::error!("pg-idempotency: the handler failed: {e}");
            INTERNAL_ERROR.response(1)
        }
    }
}

/// A connection inside a transaction that is dropped from the pool unless it ends cleanly:
/// it never goes back to the pool in a transaction.
struct InTransaction(Option<Object>);

impl InTransaction {
    fn conn(&self) -> &tokio_postgres::Client {
        self.0.as_ref().expect("open")
    }

    async fn end(self, commit: bool) -> Result<(), Error> {
        let result = self.conn().batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }).await;
        self.ended(result)
    }

    /// The answer to the COMMIT or ROLLBACK that ended the transaction: when it came, the
    /// connection goes back to the pool, outside any transaction.
    fn ended(mut self, result: Result<(), tokio_postgres::Error>) -> Result<(), Error> {
        if result.is_ok() {
            self.0.take();
        }
        result.map_err(Error::from)
    }

    /// ROLLBACK in a task of its own: the caller answers at once (the claim wrote nothing), the
    /// connection goes back to the pool when the ROLLBACK is answered.
    fn roll_back_later(self) {
        tokio::spawn(async move {
            if let Err(e) = self.end(false).await {
                log::warn!("pg-idempotency: ROLLBACK after an answer without work: {e}");
            }
        });
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            // Still in a transaction: close the connection (the server rolls back).
            drop(Object::take(conn));
        }
    }
}

pub(crate) async fn same_transaction<S>(r: Claiming<'_>, parts: Parts, inner: S) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let (tx, claim) = match claim_in_transaction(&r).await {
        Ok(claimed) => claimed,
        Err(answer) => return answer,
    };
    if !claim.outcome.owns() {
        // The claim wrote nothing: the answer goes out now, the ROLLBACK after it.
        tx.roll_back_later();
        return answer_without_work(&claim);
    }
    let mut tx = tx;
    let shared = r.shared(&claim, tx.0.take());
    let response = run_handler(inner, parts, r.body.clone(), Idem(shared.clone())).await;
    let Some(conn) = shared.conn.lock().await.take() else {
        return INTERNAL_ERROR.response(1);
    };
    let tx = InTransaction(Some(conn));
    match r.disposition(&response) {
        Disposition::Store => match stored_form(&r, response).await {
            Ok(stored) => complete_and_commit(&shared, tx, &stored, true).await,
            Err(answer) => {
                let _ = tx.end(false).await;
                answer
            }
        },
        Disposition::Release | Disposition::Keep => {
            let _ = tx.end(false).await; // the claim goes with the rollback
            response
        }
    }
}

/// A live connection with `BEGIN` and the (deferred) claim sent on it in one round trip, the
/// transaction left open; or the answer to send. A claim whose connection turned out dead on
/// the way (the server restarted, or ended the session) is sent once more on another
/// connection: its transaction did not commit. Connections are waited for until the
/// request's deadline.
async fn claim_in_transaction(r: &Claiming<'_>) -> Result<(InTransaction, Claim), Response> {
    let deadline = r.deadline;
    let begin = format!("BEGIN; SET LOCAL lock_timeout = '{}ms'", r.cfg.lock_timeout.as_millis());
    let token = uuid::Uuid::new_v4();
    for last in [false, true] {
        let conn = pool::live(&r.cfg.pool, deadline).await.map_err(|e| error_response("pool", &e))?;
        let tx = InTransaction(Some(conn));
        // BEGIN and the claim in one round trip: tokio-postgres sends a request when its future
        // is first polled, and `join` polls the BEGIN first, then the claim, before waiting on
        // either. A duplicate of a request whose transaction is still open waits in the claim
        // (the key lock), then answers `replay` (it committed) or `claimed` (it rolled back).
        let (begun, claimed) =
            join(tx.conn().batch_execute(&begin), r.claim(tx.conn(), None, token, true)).await;
        let e = match (begun, claimed) {
            (Ok(()), Ok(c)) => return Ok((tx, c)),
            (Err(e), _) => Error::from(e),
            (Ok(()), Err(e)) => e,
        };
        if !last && e.unavailable() {
            log::warn!(
                "pg-idempotency: {} key={:?}: the claim's connection was lost ({e}); sending it again on another",
                r.scope,
                r.key
            );
            drop(tx); // closed, out of the pool
            continue;
        }
        let _ = tx.end(false).await;
        return Err(error_response("idem_claim", &e));
    }
    unreachable!("the second try returns")
}

/// The stored form of the handler's response, or the error answer when it cannot be stored
/// (the caller rolls back or releases).
async fn stored_form(r: &Claiming<'_>, response: Response) -> Result<Stored, Response> {
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, usize::MAX).await.map_err(|e| {
        log::error!("pg-idempotency: reading the handler's response: {e}");
        INTERNAL_ERROR.response(1)
    })?;
    to_stored(parts.status, &parts.headers, &bytes, &r.cfg.replay_headers).map_err(|why| {
        log::error!("pg-idempotency: the response cannot be stored ({}); claim released", why.0);
        INTERNAL_ERROR.response(1)
    })
}

async fn complete(
    db: &tokio_postgres::Client,
    shared: &Shared,
    stored: &Stored,
) -> Result<Option<String>, Error> {
    client::complete(
        db,
        &shared.scope,
        &shared.key,
        shared.token,
        stored.status,
        stored.body.as_ref(),
        Some(&stored.headers),
    )
    .await
}

/// The answer to send after `idem_complete`: the stored bytes, or an error answer.
/// `uncommitted_is_unavailable`: the transaction held all the work (same transaction), so a
/// session the server ended before it committed means nothing was done (503).
fn completed(
    shared: &Shared,
    stored: &Stored,
    done: Result<Option<String>, Error>,
    uncommitted_is_unavailable: bool,
) -> Result<Response, Response> {
    match done {
        Ok(text) => {
            let body = body_bytes(&stored.headers, stored.body.as_ref(), text.as_deref());
            Ok(from_stored(stored.status, &stored.headers, body, false))
        }
        Err(e) if e.lost_claim() => {
            log::warn!(
                "pg-idempotency: {} key={:?}: late completion fenced ({e}); not reported as success",
                shared.scope,
                shared.key
            );
            Err(SUPERSEDED.response(1))
        }
        Err(e) if uncommitted_is_unavailable && (ended_uncommitted(&e) || e.connection_lost()) => {
            // No answer to idem_complete: the COMMIT sent with it never ran. PostgreSQL flushes
            // a statement's answer (at its ReadyForQuery) before it reads the next one, so a
            // server that ran the COMMIT had sent idem_complete's answer first; and the server's
            // goodbye that tokio-postgres reads while no request is pending (a 57P01 to an idle
            // session) ends the connection before the two were written.
            Err(nothing_committed(shared, &e))
        }
        Err(e) => Err(error_after_work("idem_complete", &e)),
    }
}

/// The server ended the session while the statement ran, so its transaction did not commit:
/// 57P01 (a fast or smart shutdown, `pg_terminate_backend`). The server acts on it only where the
/// transaction can still roll back, never inside a commit, and a COMMIT's own answer goes out
/// before the next such check. (A crash, 57P02, or a COMMIT's connection lost after
/// idem_complete was answered, can come after the commit: the outcome is unknown, a 500.)
fn ended_uncommitted(e: &Error) -> bool {
    e.sqlstate() == Some("57P01")
}

fn nothing_committed(shared: &Shared, why: &dyn std::fmt::Display) -> Response {
    log::warn!(
        "pg-idempotency: {} key={:?}: the server ended the session before the COMMIT ({why}); nothing was committed",
        shared.scope,
        shared.key
    );
    SERVICE_UNAVAILABLE.response(1)
}

/// `idem_complete` and `COMMIT` in one round trip (pipelined as BEGIN and the claim are). A
/// failed `idem_complete` aborts the transaction and the COMMIT then rolls it back, so the
/// answers stay what they were with two trips: the complete's error as before; a COMMIT
/// without an answer is an error after the work (outcome unknown), never a success.
/// `uncommitted_is_unavailable` (same transaction): a connection the server closed before they
/// were sent, lost before idem_complete was answered, or a 57P01 in answer to either, is a 503:
/// nothing was committed.
async fn complete_and_commit(
    shared: &Shared,
    tx: InTransaction,
    stored: &Stored,
    uncommitted_is_unavailable: bool,
) -> Response {
    if uncommitted_is_unavailable && tx.conn().is_closed() {
        return nothing_committed(shared, &"the connection was closed while the handler ran");
    }
    let (done, commit) = join(complete(tx.conn(), shared, stored), tx.conn().batch_execute("COMMIT")).await;
    let committed = tx.ended(commit);
    match (completed(shared, stored, done, uncommitted_is_unavailable), committed) {
        (Ok(answer), Ok(())) => answer,
        (Ok(_), Err(e)) if uncommitted_is_unavailable && ended_uncommitted(&e) => {
            nothing_committed(shared, &e)
        }
        (Ok(_), Err(e)) => error_after_work("COMMIT", &e),
        (Err(answer), _) => answer,
    }
}

pub(crate) async fn committed_first<S>(r: Claiming<'_>, parts: Parts, inner: S) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    // With the caller-chosen token (extension 0.4.0), a claim whose connection broke (its
    // COMMIT may or may not have happened) is repeated once with the same token: the extension
    // answers `claimed` again if the first one did commit.
    let token = uuid::Uuid::new_v4();
    let deadline = r.deadline;
    let mut tries = if r.features.claim_wait_and_token { 2 } else { 1 };
    let claim = loop {
        tries -= 1;
        let attempt = match pool::live(&r.cfg.pool, deadline).await {
            Ok(conn) => r.claim(&conn, Some(r.cfg.lease), token, false).await,
            Err(e) => Err(e),
        };
        match attempt {
            Ok(c) => break c,
            Err(e) if tries > 0 && e.unavailable() && !matches!(e, Error::Pool(_)) => {
                log::warn!("pg-idempotency: idem_claim: {e}; repeating it with the same token")
            }
            Err(e) => return error_response("idem_claim", &e),
        }
    };
    if !claim.outcome.owns() {
        return answer_without_work(&claim);
    }
    let shared = r.shared(&claim, None);
    let handler = tokio::spawn(run_handler(inner, parts, r.body.clone(), Idem(shared.clone())));
    let abort = handler.abort_handle();
    let response = tokio::select! {
        done = handler => done.unwrap_or_else(|e| {
            log::error!("pg-idempotency: the handler task failed: {e}");
            INTERNAL_ERROR.response(1)
        }),
        lost = renew(&shared) => {
            abort.abort();
            log::warn!("pg-idempotency: {} key={:?}: claim lost while the handler ran ({lost}); handler stopped",
                       shared.scope, shared.key);
            return SUPERSEDED.response(1);
        }
    };
    let tx = shared.conn.lock().await.take().map(|c| InTransaction(Some(c)));
    match r.disposition(&response) {
        Disposition::Store => {
            let stored = match stored_form(&r, response).await {
                Ok(s) => s,
                Err(answer) => {
                    if let Some(tx) = tx {
                        let _ = tx.end(false).await;
                    }
                    return answer;
                }
            };
            match tx {
                Some(tx) => complete_and_commit(&shared, tx, &stored, false).await,
                None => match pool::live_within(&r.cfg.pool, r.cfg.connection_timeout).await {
                    Ok(conn) => completed(&shared, &stored, complete(&conn, &shared, &stored).await, false)
                        .unwrap_or_else(|answer| answer),
                    Err(e) => error_after_work("pool", &e),
                },
            }
        }
        Disposition::Release => {
            if let Some(tx) = tx {
                let _ = tx.end(false).await;
            }
            match pool::live_within(&r.cfg.pool, r.cfg.connection_timeout).await {
                Ok(conn) => match client::release(&**conn, &shared.scope, &shared.key, shared.token).await {
                    Ok(true) => log::info!("pg-idempotency: {} key={:?}: released", shared.scope, shared.key),
                    Ok(false) => log::warn!(
                        "pg-idempotency: {} key={:?}: release found the claim gone",
                        shared.scope,
                        shared.key
                    ),
                    Err(e) => log::error!("pg-idempotency: idem_release: {e}"),
                },
                Err(e) => log::error!("pg-idempotency: idem_release: {e}"),
            }
            response
        }
        Disposition::Keep => {
            if let Some(tx) = tx {
                let _ = tx.end(false).await;
            }
            response
        }
    }
}

/// Renews the lease every third of it while renewal is on; returns only when the claim is
/// lost (IK001/IK002).
async fn renew(shared: &Shared) -> Error {
    let every = (shared.lease / 3).max(Duration::from_millis(30));
    loop {
        tokio::time::sleep(every).await;
        if !shared.renewing.load(Ordering::SeqCst) {
            continue;
        }
        let (point, data) = shared.progress.lock().unwrap().clone();
        let point = point.unwrap_or_else(|| NO_CHECKPOINT.to_owned());
        let result = match pool::live_within(&shared.pool, shared.connection_timeout).await {
            Ok(conn) => {
                client::checkpoint(
                    &**conn,
                    &shared.scope,
                    &shared.key,
                    shared.token,
                    &point,
                    data.as_ref(),
                    Some(shared.lease),
                )
                .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(_) => {}
            Err(e) if e.lost_claim() => return e,
            Err(e) => log::warn!("pg-idempotency: lease renewal failed (will retry): {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::answer_without_work;
    use crate::client::{Claim, Outcome};

    fn claim(outcome: Outcome) -> Claim {
        Claim {
            outcome,
            token: None,
            http_status: None,
            response_status: None,
            response_headers: None,
            response_body: None,
            response_body_text: None,
            recovery_point: None,
            recovery_data: None,
            attempts: None,
            expires_at: None,
            lease_left: None,
        }
    }

    #[test]
    fn outcomes_without_work_map_to_their_answers() {
        let busy = Claim { lease_left: Some(Duration::from_millis(1200)), ..claim(Outcome::InProgress) };
        let r = answer_without_work(&busy);
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()["retry-after"], "2", "rounded up");
        let r =
            answer_without_work(&Claim { lease_left: Some(Duration::ZERO), ..claim(Outcome::InProgress) });
        assert_eq!(r.headers()["retry-after"], "1", "at least 1");
        assert_eq!(answer_without_work(&claim(Outcome::Mismatch)).status(), 422);
        let gone = answer_without_work(&claim(Outcome::Expired));
        assert_eq!(gone.status(), 410);
        assert_eq!(gone.headers()["content-type"], "application/problem+json");
        let replay = Claim {
            response_status: Some(201),
            response_headers: Some(json!({"Location": "/a", "Content-Type": "application/json"})),
            response_body: Some(json!({"id": 1})),
            response_body_text: Some("{\"id\": 1}".into()),
            ..claim(Outcome::Replay)
        };
        let r = answer_without_work(&replay);
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["location"], "/a");
        assert_eq!(r.headers()["idempotent-replayed"], "true");
    }
}
