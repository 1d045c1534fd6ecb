//! Taking a connection from the application's deadpool pool the way the layer does: a live one,
//! within the layer's own bound, whatever the pool's own timeouts (deadpool waits forever by
//! default).

use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError, TimeoutType};
use tokio::time::Instant;

use crate::error::Error;

/// How long the layer waits for a connection by default: a request answers 503 within
/// this (and its claim), well inside the contract's "503 within 2 s".
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection of `pool` that the server has not closed, by `deadline`. One found closed (the
/// server restarted while it sat in the pool, and its connection task has seen the end) is
/// taken out of the pool and the next one taken; nothing was sent on it. No connection by the
/// deadline (the database down, the pool exhausted): [`Error::Pool`] with a wait timeout, which
/// is [`Error::unavailable`].
pub(crate) async fn live(pool: &Pool, deadline: Instant) -> Result<Object, Error> {
    loop {
        let got = tokio::time::timeout_at(deadline, pool.get())
            .await
            .map_err(|_| Error::Pool(PoolError::Timeout(TimeoutType::Wait)))?;
        let conn = got?;
        if !conn.is_closed() {
            return Ok(conn);
        }
        log::info!(
            "pg-idempotency: a pooled connection was closed by the server (a restart?): taking another"
        );
        drop(Object::take(conn));
    }
}

/// [`live`] with the deadline `wait` from now.
pub(crate) async fn live_within(pool: &Pool, wait: Duration) -> Result<Object, Error> {
    live(pool, Instant::now() + wait).await
}
