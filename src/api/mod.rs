//! What SQL sees: the `#[pg_extern]` functions. Each checks its arguments (`validate`),
//! runs its statements (`spi`) and raises any error at the very top (`OrRaise`).

mod claim;
mod fingerprint;
mod lifecycle;
mod lookup;
mod maintenance;
mod null_scope_guard;
mod seen;
