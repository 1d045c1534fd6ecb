//! What SQL sees: the `#[pg_extern]` functions. Each checks its arguments (`validate`),
//! runs its statements (`spi`) and raises any error at the very top (`OrRaise`).
//!
//! Inside: `claim` uses `wait` (idem_claim's `wait`), and both use `claim_result` (the row
//! they answer with); `compat` (symbols for older releases' SQL) uses `claim`. `claim`,
//! `lifecycle` and `lookup` use `deferred` (the claims this transaction holds unwritten);
//! below them, `stored` (a record as read) and `write` (creating one). `send_next` and
//! `send_result` (the sending side's hot path) use `send_budget` (the retry budget's counts).

mod claim;
mod claim_result;
mod compat;
mod deferred;
mod fingerprint;
mod lifecycle;
mod lookup;
mod maintenance;
mod null_scope_guard;
mod seen;
mod send_budget;
mod send_next;
mod send_result;
mod stored;
mod wait;
mod write;
