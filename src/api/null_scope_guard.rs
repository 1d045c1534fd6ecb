//! The NULL-scope guard (SQL: `idempotency.idem_scope_support(internal)`): a planner
//! support function attached (sql/citus.sql) to every scope-first function. While a call is
//! simplified at plan time it refuses a NULL constant scope with 22004. On a Citus coordinator that happens before function-call delegation
//! reads the scope to pick a shard: Citus 13.0 hashes a NULL distribution argument without
//! checking it and the coordinator crashes (signal 11), so a delegated function must never
//! reach Citus with one. Anything else (a non-NULL scope, a parameter, an expression) is
//! left alone, and the function's own checks run as before.

use pgrx::datum::Internal;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgList;

use crate::errors::{raise, IdemError};

#[pg_extern(immutable, parallel_safe, strict)]
fn idem_scope_support(request: Internal) -> Internal {
    // SAFETY: PostgreSQL calls a support function with a pointer to a planner support
    // request node; for SupportRequestSimplify, fcall is the call being simplified, with
    // its arguments already simplified (a NULL or a bound parameter is a Const by now).
    unsafe {
        if let Some(datum) = request.unwrap() {
            let node = datum.cast_mut_ptr::<pg_sys::Node>();
            if pgrx::is_a(node, pg_sys::NodeTag::T_SupportRequestSimplify) {
                let call = (*node.cast::<pg_sys::SupportRequestSimplify>()).fcall;
                let args = PgList::<pg_sys::Node>::from_pg((*call).args);
                if let Some(first) = args.get_ptr(0) {
                    let scope = pg_sys::strip_implicit_coercions(first);
                    if pgrx::is_a(scope, pg_sys::NodeTag::T_Const)
                        && (*scope.cast::<pg_sys::Const>()).constisnull
                    {
                        raise(IdemError::NullArgument { arg: "scope" });
                    }
                }
            }
        }
    }
    // "No simplification": a NULL pointer, returned as a non-null datum (PostgreSQL
    // refuses a support function that returns SQL NULL).
    Internal::from(Some(pg_sys::Datum::from(0usize)))
}
