//! Idempotency-Key for axum / tower on top of the `idempotency` PostgreSQL extension.
//!
//! - [`client`]: the extension's SQL functions, typed ([`Outcome`], [`Claim`], [`Error`]).
//! - [`IdempotencyLayer`]: a tower `Layer` for an axum route, in same-transaction or
//!   committed-first mode; handlers take the [`Idem`] extractor and write through
//!   [`Idem::db`].
//! - [`sender`]: the sending side: [`sender::prepare`] in your transaction, a
//!   [`sender::Sender`] that delivers after COMMIT or runs as a worker.
//!
//! See README.md for the whole setup.

// Result<_, Response> is axum's idiom for "answer this now"; a Response is large, that is fine.
#![allow(clippy::result_large_err)]

pub mod client;
#[cfg(test)]
mod contract_tests;
mod error;
mod handle;
pub mod key;
mod layer;
mod pool;
pub mod response;
mod run;
mod send_settings;
pub mod sender;
mod settings;

pub use client::{Claim, ClaimArgs, Features, Fingerprint, Outcome, Record};
pub use error::Error;
pub use handle::{Db, Disposition, Idem};
pub use layer::{IdempotencyLayer, Idempotent};
pub use pool::CONNECTION_TIMEOUT;
pub use settings::{route_of, Mode, OnServerError, ScopeFn, REFUSED_STATUSES};
