//! idem_claim's answer: one row of `idempotency.claim_result`, before it becomes a tuple.
//! Below both the claim (src/api/claim.rs) and its wait (src/api/wait.rs), which reads the
//! outcome and the times of each answer.

use pgrx::datum::{TimestampWithTimeZone, Uuid};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys;
use pgrx::{AllocatedByRust, IntoDatum, PgTupleDesc};

use crate::jsonb::Jsonb;
use crate::record::Outcome;

/// One `idempotency.claim_result`, before it becomes a tuple.
pub(super) struct Answer {
    pub(super) outcome: Outcome,
    pub(super) token: Option<Uuid>,
    pub(super) http_status: Option<i32>,
    pub(super) response_status: Option<i32>,
    pub(super) response_headers: Option<Jsonb>,
    pub(super) response_body: Option<Jsonb>,
    pub(super) recovery_point: Option<String>,
    pub(super) recovery_data: Option<Jsonb>,
    pub(super) attempts: Option<i32>,
    pub(super) expires_at: Option<TimestampWithTimeZone>,
    pub(super) locked_until: Option<TimestampWithTimeZone>,
}

impl Answer {
    /// An answer of `outcome` with every other column NULL.
    pub(super) fn empty(outcome: Outcome) -> Self {
        Answer {
            outcome,
            token: None,
            http_status: None,
            response_status: None,
            response_headers: None,
            response_body: None,
            recovery_point: None,
            recovery_data: None,
            attempts: None,
            expires_at: None,
            locked_until: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn claimed(
        outcome: Outcome,
        token: Uuid,
        attempts: i32,
        locked_until: TimestampWithTimeZone,
        expires_at: TimestampWithTimeZone,
        recovery_point: Option<String>,
        recovery_data: Option<Jsonb>,
    ) -> Self {
        Answer {
            token: Some(token),
            attempts: Some(attempts),
            locked_until: Some(locked_until),
            expires_at: Some(expires_at),
            recovery_point,
            recovery_data,
            ..Answer::empty(outcome)
        }
    }

    pub(super) fn mismatch(expires_at: TimestampWithTimeZone) -> Self {
        Answer { http_status: Some(422), expires_at: Some(expires_at), ..Answer::empty(Outcome::Mismatch) }
    }

    pub(super) fn into_tuple(
        self,
        fcinfo: pg_sys::FunctionCallInfo,
    ) -> PgHeapTuple<'static, AllocatedByRust> {
        let datums = [
            self.outcome.as_str().into_datum(),
            self.token.into_datum(),
            self.http_status.into_datum(),
            self.response_status.into_datum(),
            self.response_headers.into_datum(),
            self.response_body.into_datum(),
            self.recovery_point.into_datum(),
            self.recovery_data.into_datum(),
            self.attempts.into_datum(),
            self.expires_at.into_datum(),
            self.locked_until.into_datum(),
        ];
        // SAFETY: fcinfo is this call's; get_call_result_type gives the declared result
        // type's descriptor (claim_result), allocated for this call; the datums match it
        // column by column.
        unsafe {
            let mut tupdesc: pg_sys::TupleDesc = std::ptr::null_mut();
            let class = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut tupdesc);
            assert_eq!(
                class,
                pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE,
                "claim_result must be a composite type"
            );
            PgHeapTuple::from_datums(PgTupleDesc::from_pg_unchecked(tupdesc), datums)
                .expect("claim_result has the columns idem_claim fills")
        }
    }
}
