//! A route's settings: what [`IdempotencyLayer`](crate::IdempotencyLayer)'s builder sets and
//! the run of each request (`run`) reads.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::request::Parts;
use axum::http::{header, HeaderName};
use axum::response::Response;
use deadpool_postgres::Pool;
use tokio::sync::OnceCell;

use crate::client::Features;

/// How a route claims its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Claim, the handler's writes and the stored response commit in one transaction.
    SameTransaction,
    /// The claim commits at once with a lease (renewed while the handler runs); the response
    /// is stored after the handler.
    CommittedFirst,
}

/// What a 5xx answer of the handler does to the claim, unless the handler marked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnServerError {
    /// Give the key back (the default): the next request runs as new.
    Release,
    /// Store it: retries get the same 5xx.
    Store,
}

/// Handler answers that mean "refused before any work" (contract/contract.json's
/// `refused_statuses`, the same in every package; 422 is also what axum's `Json` extractor
/// answers for a body of the wrong shape): never stored, the claim is given back, so the client
/// can fix the request and retry with the same key.
pub const REFUSED_STATUSES: [u16; 13] = [400, 401, 403, 404, 405, 406, 408, 411, 413, 414, 415, 422, 429];

/// Computes the scope of a request, or answers it at once (for example 401 without a tenant).
pub type ScopeFn = Arc<dyn Fn(&Parts) -> Result<String, Response> + Send + Sync>;

/// `METHOD /route/template` (axum's matched path, or the request path outside a router).
pub fn route_of(parts: &Parts) -> String {
    let path = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| parts.uri.path().to_owned());
    format!("{} {}", parts.method, path)
}

/// The settings of one layer, shared by every request it wraps.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) pool: Pool,
    pub(crate) mode: Mode,
    pub(crate) lease: Duration,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) lock_timeout: Duration,
    /// How long a request waits for a live connection of the pool before its 503.
    pub(crate) connection_timeout: Duration,
    pub(crate) ignore: Vec<String>,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) on_server_error: OnServerError,
    pub(crate) refused_statuses: Vec<u16>,
    pub(crate) scope: ScopeFn,
    pub(crate) max_body: usize,
    /// What the installed extension offers, read once on first use.
    pub(crate) features: Arc<OnceCell<Features>>,
}

impl Settings {
    /// The defaults [`IdempotencyLayer::new`](crate::IdempotencyLayer::new) documents.
    pub(crate) fn new(pool: Pool) -> Self {
        Settings {
            pool,
            mode: Mode::SameTransaction,
            lease: Duration::from_secs(30),
            ttl: None,
            wait: None,
            lock_timeout: Duration::from_secs(5),
            connection_timeout: crate::pool::CONNECTION_TIMEOUT,
            ignore: Vec::new(),
            replay_headers: vec![header::LOCATION, header::CONTENT_TYPE],
            on_server_error: OnServerError::Release,
            refused_statuses: REFUSED_STATUSES.to_vec(),
            scope: Arc::new(|parts| Ok(route_of(parts))),
            max_body: 1 << 20,
            features: Arc::new(OnceCell::new()),
        }
    }
}
