//! The tower `Layer`: Idempotency-Key for an axum route, in one of two modes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::to_bytes;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::HeaderName;
use axum::response::Response;
use deadpool_postgres::Pool;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::client;
use crate::key;
use crate::pool;
use crate::response::{app_problem, INTERNAL_ERROR, KEY_INVALID, KEY_MISSING};
use crate::run::{committed_first, error_response, same_transaction, Claiming};
use crate::settings::{Mode, OnServerError, Settings};

/// The layer and its settings (a builder: every setter returns the changed layer).
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Settings,
}

impl IdempotencyLayer {
    /// Same-transaction mode, scope `METHOD /template`, replayed headers Location and
    /// Content-Type, lease 30 s (committed first), 5xx and refusals released, bodies up to 1 MiB.
    pub fn new(pool: Pool) -> Self {
        IdempotencyLayer { settings: Settings::new(pool) }
    }
    pub fn same_transaction(mut self) -> Self {
        self.settings.mode = Mode::SameTransaction;
        self
    }
    /// Committed-first mode with this lease (renewed every third of it while the handler runs).
    pub fn committed_first(mut self, lease: Duration) -> Self {
        self.settings.mode = Mode::CommittedFirst;
        self.settings.lease = lease.max(Duration::from_millis(100));
        self
    }
    /// The record's time to live (default: the setting `idempotency.default_ttl`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = Some(ttl);
        self
    }
    /// Duplicates wait up to this long for the first request (extension 0.4.0 and later;
    /// ignored before), instead of answering 409 at once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = Some(wait);
        self
    }
    /// Same transaction: how long a duplicate waits behind the first one's open transaction
    /// before it answers 409 (default 5 s).
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.settings.lock_timeout = d;
        self
    }
    /// How long a request waits for a live connection of the pool (default 1 s), whatever the
    /// pool's own timeouts: with the database down, requests answer 503 within this.
    pub fn connection_timeout(mut self, d: Duration) -> Self {
        self.settings.connection_timeout = d;
        self
    }
    /// Top-level JSON fields left out of the fingerprint.
    pub fn ignore_fields(mut self, fields: &[&str]) -> Self {
        self.settings.ignore = fields.iter().map(|f| f.to_string()).collect();
        self
    }
    /// Response headers stored and replayed (default Location, Content-Type).
    pub fn replay_headers(mut self, names: &[HeaderName]) -> Self {
        self.settings.replay_headers = names.to_vec();
        self
    }
    pub fn on_server_error(mut self, what: OnServerError) -> Self {
        self.settings.on_server_error = what;
        self
    }
    /// Handler answers given back instead of stored (default [`REFUSED_STATUSES`](crate::REFUSED_STATUSES)):
    /// validation errors, including the rejections of axum's extractors, leave the key free.
    pub fn refused_statuses(mut self, statuses: &[u16]) -> Self {
        self.settings.refused_statuses = statuses.to_vec();
        self
    }
    /// The scope of a request (default [`route_of`](crate::route_of)); an `Err` response is sent as it is.
    pub fn scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Result<String, Response> + Send + Sync + 'static,
    {
        self.settings.scope = Arc::new(f);
        self
    }
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.settings.max_body = bytes;
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;
    fn layer(&self, inner: S) -> Idempotent<S> {
        Idempotent { inner, cfg: Arc::new(self.settings.clone()) }
    }
}

/// The service the layer wraps a route in.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    cfg: Arc<Settings>,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<S> Service<Request> for Idempotent<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> BoxFuture {
        let inner = self.inner.clone();
        let cfg = self.cfg.clone();
        Box::pin(async move {
            // In a task of its own: a client that goes away does not cut the work (and its
            // transaction) in half; the retry gets the stored answer.
            match tokio::spawn(handle(cfg, inner, req)).await {
                Ok(r) => Ok(r),
                Err(e) => {
                    log::error!("pg-idempotency: request task failed: {e}");
                    Ok(INTERNAL_ERROR.response(1))
                }
            }
        })
    }
}

/// The answer to a missing or malformed Idempotency-Key.
pub(crate) fn key_problem(e: &key::KeyError) -> Response {
    match e {
        key::KeyError::Missing => KEY_MISSING.response(1),
        _ => KEY_INVALID.response(1),
    }
}

async fn handle<S>(cfg: Arc<Settings>, inner: S, req: Request) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let (parts, body) = req.into_parts();
    let scope = match (cfg.scope)(&parts) {
        Ok(s) => s,
        Err(answer) => return answer,
    };
    let values: Vec<&[u8]> = parts.headers.get_all("idempotency-key").iter().map(|v| v.as_bytes()).collect();
    let key = match key::parse(&values) {
        Ok(k) => k,
        Err(e) => return key_problem(&e),
    };
    let bytes = match to_bytes(body, cfg.max_body).await {
        Ok(b) => b,
        Err(_) => {
            return app_problem(
                413,
                "Content too large",
                "The request body is larger than this route accepts.",
            )
        }
    };
    // One bound for every connection the request waits for before its claim is answered.
    let deadline = Instant::now() + cfg.connection_timeout;
    let features = match cfg
        .features
        .get_or_try_init(|| async {
            let conn = pool::live(&cfg.pool, deadline).await?;
            client::features(&**conn).await
        })
        .await
    {
        Ok(f) => *f,
        Err(e) => return error_response("reading the extension's features", &e),
    };
    let request = Claiming { cfg: &cfg, features, scope, key, body: bytes, deadline };
    match cfg.mode {
        Mode::SameTransaction => same_transaction(request, parts, inner).await,
        Mode::CommittedFirst => committed_first(request, parts, inner).await,
    }
}
