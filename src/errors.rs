//! Every error the extension raises on purpose, with its SQLSTATE, in one place.
//!
//! The error table of docs/reference.md is written from this file. Errors that PostgreSQL itself
//! raises while we run a statement (40001, 55P03, 57014, 25006 ...) pass through unchanged.

use std::ffi::{c_char, c_int, CString};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemError {
    /// 22004: a NULL where a value is required.
    NullArgument { arg: &'static str },
    /// 22004: a NULL element of an array argument (position counted from 1).
    NullElement { arg: &'static str, position: usize },
    /// 22004: one of two arguments that go together is NULL while the other is given.
    NullWhenGiven { arg: &'static str, other: &'static str },
    /// 22023: a value that is not acceptable for the argument.
    InvalidArgument { arg: &'static str, problem: String },
    /// 54000: a stored response or checkpoint larger than idempotency.max_response_size.
    TooLarge { arg: &'static str, size: usize, limit: usize },
    /// IK001: idem_complete / idem_checkpoint found no live record for (scope, key).
    NoLiveRecord { scope: String, key: String },
    /// IK002: the record exists but another token owns it now (taken over, or released and claimed again).
    NotOwner { scope: String, key: String },
    /// IK003: the record was already completed by this token.
    AlreadyCompleted { scope: String, key: String },
    /// 25006: a write function was called on a hot standby.
    ReadOnlyServer { function: &'static str },
    /// IK001: idem_send_result found no outbound record for (scope, operation).
    NoOutbound { scope: String, operation: String },
    /// IK002: the send's lease was lost: another sender took it, or its result was recorded.
    SendNotHeld { scope: String, operation: String },
    /// IK003: the send is already done with this token.
    SendAlreadyDone { scope: String, operation: String },
    /// 40001: the claim kept losing races with concurrent changes of the same key.
    ClaimContended { scope: String, key: String },
    /// 40001: under REPEATABLE READ or SERIALIZABLE, the key's record changed (or, `deleted`,
    /// went) after the transaction's snapshot (PostgreSQL's own words for the same case).
    ConcurrentChange { deleted: bool },
}

impl IdemError {
    pub fn invalid(arg: &'static str, problem: impl Into<String>) -> Self {
        IdemError::InvalidArgument { arg, problem: problem.into() }
    }

    pub fn sqlstate(&self) -> &'static str {
        match self {
            IdemError::NullArgument { .. }
            | IdemError::NullElement { .. }
            | IdemError::NullWhenGiven { .. } => "22004",
            IdemError::InvalidArgument { .. } => "22023",
            IdemError::TooLarge { .. } => "54000",
            IdemError::NoLiveRecord { .. } | IdemError::NoOutbound { .. } => "IK001",
            IdemError::NotOwner { .. } | IdemError::SendNotHeld { .. } => "IK002",
            IdemError::AlreadyCompleted { .. } | IdemError::SendAlreadyDone { .. } => "IK003",
            IdemError::ReadOnlyServer { .. } => "25006",
            IdemError::ClaimContended { .. } | IdemError::ConcurrentChange { .. } => "40001",
        }
    }

    pub fn message(&self) -> String {
        match self {
            IdemError::NullArgument { arg } => format!("argument \"{arg}\" must not be null"),
            IdemError::NullElement { arg, position } => {
                format!("argument \"{arg}\" must not contain nulls (element {position} is null)")
            }
            IdemError::NullWhenGiven { arg, other } => {
                format!("argument \"{arg}\" must not be null when \"{other}\" is given")
            }
            IdemError::InvalidArgument { arg, problem } => {
                format!("invalid argument \"{arg}\": {problem}")
            }
            IdemError::TooLarge { arg, size, limit } => {
                format!("argument \"{arg}\" is too large to store: {size} bytes, the limit is {limit} bytes")
            }
            IdemError::NoLiveRecord { scope, key } => {
                format!("no live idempotency record for scope {scope:?}, key {key:?}")
            }
            IdemError::NotOwner { scope, key } => {
                format!("token does not own the idempotency record for scope {scope:?}, key {key:?}")
            }
            IdemError::AlreadyCompleted { scope, key } => {
                format!("idempotency record for scope {scope:?}, key {key:?} is already completed")
            }
            IdemError::ReadOnlyServer { function } => {
                format!("{function} cannot run on a read-only server")
            }
            // The sending side's words are sql/send.sql's (the portable edition's), to the letter.
            IdemError::NoOutbound { scope, operation } => {
                format!("no outbound record for operation \"{operation}\" in scope \"{scope}\"")
            }
            IdemError::SendNotHeld { scope, operation } => {
                format!("the token no longer holds operation \"{operation}\" in scope \"{scope}\"")
            }
            IdemError::SendAlreadyDone { scope, operation } => {
                format!("operation \"{operation}\" in scope \"{scope}\" is already done with this token")
            }
            IdemError::ClaimContended { scope, key } => {
                format!("could not claim scope {scope:?}, key {key:?}: it kept changing concurrently")
            }
            IdemError::ConcurrentChange { deleted } => format!(
                "could not serialize access due to concurrent {}",
                if *deleted { "delete" } else { "update" }
            ),
        }
    }

    pub fn detail(&self) -> Option<String> {
        match self {
            IdemError::NoLiveRecord { .. } => {
                Some("The key was never claimed, was released, or its record expired.".into())
            }
            IdemError::NotOwner { .. } => Some(
                "Another worker took the claim over after its lease ended, or the claim was released.".into(),
            ),
            _ => None,
        }
    }

    pub fn hint(&self) -> Option<String> {
        match self {
            IdemError::NotOwner { .. } => Some(
                "Do not report success: the current owner will finish the operation. Renew long leases with idem_checkpoint."
                    .into(),
            ),
            IdemError::AlreadyCompleted { .. } => {
                Some("Call idem_complete once per claim; retries get the stored response from idem_claim.".into())
            }
            IdemError::TooLarge { .. } => Some(
                "Raise idempotency.max_response_size, or store a reference to the data instead of the data."
                    .into(),
            ),
            IdemError::ReadOnlyServer { .. } => {
                Some("Claims must run on the primary; idem_lookup works on a standby.".into())
            }
            IdemError::ClaimContended { .. } | IdemError::ConcurrentChange { .. } => {
                Some("Retry the transaction.".into())
            }
            IdemError::SendNotHeld { .. } => {
                Some("Its lease ended and another sender took it, or its result was recorded.".into())
            }
            _ => None,
        }
    }
}

fn make_sqlstate(code: &str) -> c_int {
    // PostgreSQL's MAKE_SQLSTATE: six bits per character, first character lowest.
    code.bytes().enumerate().fold(0, |acc, (i, c)| acc | ((((c - b'0') & 0x3F) as c_int) << (6 * i)))
}

// pgrx maps every SQLSTATE it does not know (our IK class among them) to XX000 when it
// reports an error for us, so custom codes are raised through elog.c directly.
extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errdetail(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// Raise `err` as a PostgreSQL ERROR. Call it only from the top of a `#[pg_extern]` body,
/// with nothing left to drop: the error unwinds by longjmp, past any Rust frame.
pub fn raise(err: IdemError) -> ! {
    const PERCENT_S: &[u8] = b"%s\0";
    let code = make_sqlstate(err.sqlstate());
    // Copied into palloc'd memory, which the transaction abort frees, so that nothing
    // Rust owns is left behind when errfinish longjmps.
    let message = palloc_cstr(err.message());
    let detail = err.detail().map(palloc_cstr);
    let hint = err.hint().map(palloc_cstr);
    drop(err);
    // SAFETY: errstart/errfinish bracket one report as elog.c requires; the strings are
    // valid C strings in the current memory context.
    unsafe {
        if errstart(pgrx::pg_sys::PGERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(PERCENT_S.as_ptr().cast(), message);
            if let Some(d) = detail {
                errdetail(PERCENT_S.as_ptr().cast(), d);
            }
            if let Some(h) = hint {
                errhint(PERCENT_S.as_ptr().cast(), h);
            }
            errfinish(c"idempotency".as_ptr(), 0, std::ptr::null());
        }
    }
    unreachable!("errfinish returned from an ERROR")
}

/// `result.or_raise()`: the value, or the error raised as a PostgreSQL ERROR. For the top
/// of a `#[pg_extern]` body, as `raise`.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T> OrRaise<T> for Result<T, IdemError> {
    fn or_raise(self) -> T {
        match self {
            Ok(value) => value,
            Err(e) => raise(e),
        }
    }
}

fn palloc_cstr(s: String) -> *const c_char {
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // SAFETY: pstrdup copies a valid NUL-terminated string into CurrentMemoryContext.
    unsafe { pgrx::pg_sys::pstrdup(c.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_packed_like_postgres() {
        // ERRCODE_NULL_VALUE_NOT_ALLOWED and ERRCODE_INVALID_PARAMETER_VALUE as PostgreSQL defines them.
        assert_eq!(
            make_sqlstate("22004"),
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED as c_int
        );
        assert_eq!(
            make_sqlstate("22023"),
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as c_int
        );
        assert_eq!(
            make_sqlstate("40001"),
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE as c_int
        );
    }

    #[test]
    fn messages_name_the_argument() {
        assert_eq!(IdemError::NullArgument { arg: "key" }.message(), "argument \"key\" must not be null");
        let e = IdemError::invalid("ttl", "must be positive");
        assert_eq!(e.message(), "invalid argument \"ttl\": must be positive");
        assert_eq!(e.sqlstate(), "22023");
    }

    #[test]
    fn ownership_errors_have_their_own_codes() {
        let s = || "acct".to_string();
        let k = || "k1".to_string();
        let codes = [
            IdemError::NoLiveRecord { scope: s(), key: k() }.sqlstate(),
            IdemError::NotOwner { scope: s(), key: k() }.sqlstate(),
            IdemError::AlreadyCompleted { scope: s(), key: k() }.sqlstate(),
        ];
        assert_eq!(codes, ["IK001", "IK002", "IK003"]);
    }

    #[test]
    fn sending_errors_say_what_sql_send_says() {
        let s = || "shop".to_string();
        let o = || "order-1:charge".to_string();
        let e = IdemError::NoOutbound { scope: s(), operation: o() };
        assert_eq!(
            (e.sqlstate(), e.message().as_str()),
            ("IK001", "no outbound record for operation \"order-1:charge\" in scope \"shop\"")
        );
        let e = IdemError::SendNotHeld { scope: s(), operation: o() };
        assert_eq!(e.sqlstate(), "IK002");
        assert_eq!(e.message(), "the token no longer holds operation \"order-1:charge\" in scope \"shop\"");
        assert!(e.hint().is_some_and(|h| h.starts_with("Its lease ended")));
        let e = IdemError::SendAlreadyDone { scope: s(), operation: o() };
        assert_eq!(e.sqlstate(), "IK003");
        assert_eq!(
            e.message(),
            "operation \"order-1:charge\" in scope \"shop\" is already done with this token"
        );
        let e = IdemError::NullWhenGiven { arg: "scope", other: "operation" };
        assert_eq!(
            (e.sqlstate(), e.message().as_str()),
            ("22004", "argument \"scope\" must not be null when \"operation\" is given")
        );
    }
}
