//! SQLSTATEs of the extension (docs/reference.md, "Error codes", in the repository) mapped to one error enum.

use std::fmt;

/// What a call of the client can fail with.
#[derive(Debug)]
pub enum Error {
    /// 22004: an argument is NULL where a value is required.
    NullArgument(tokio_postgres::Error),
    /// 22023: a bad argument value (empty or too long key, bad ttl or lease, status out of range).
    InvalidArgument(tokio_postgres::Error),
    /// 54000: a response or checkpoint larger than `idempotency.max_response_size`.
    TooLarge(tokio_postgres::Error),
    /// IK001: no live record for (scope, key): never claimed, released, or expired.
    NoRecord(tokio_postgres::Error),
    /// IK002: the token no longer owns the record (taken over): do not report success.
    NotOwner(tokio_postgres::Error),
    /// IK003: the record is already completed by this token.
    AlreadyCompleted(tokio_postgres::Error),
    /// IK004: `idem_send` of an operation already recorded with another request, target or key
    /// (an operation is sent once; a new request needs a new operation id).
    OperationReused(tokio_postgres::Error),
    /// 25006: a write function on a hot standby.
    ReadOnly(tokio_postgres::Error),
    /// 40001, 40P01: serialization failure or deadlock; the transaction may be retried.
    Retry(tokio_postgres::Error),
    /// 55P03: `lock_timeout` ran out behind another transaction's claim of the same key.
    LockTimeout(tokio_postgres::Error),
    /// 42501: the role lacks the grants, or row-level security refused the row.
    Privilege(tokio_postgres::Error),
    /// Any other database or connection error.
    Db(tokio_postgres::Error),
    /// Taking a connection from the pool failed.
    Pool(deadpool_postgres::PoolError),
    /// The installed extension lacks this function (an older release).
    Unsupported(&'static str),
    /// `idem_claim` answered an outcome this client does not know.
    UnknownOutcome(String),
    /// No outbound record for this operation: never prepared, rolled back, or swept.
    NoSend { scope: String, operation: String },
}

impl Error {
    /// The SQLSTATE, when the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        self.db_error()?.code().map(|c| c.code())
    }

    fn db_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Error::NullArgument(e)
            | Error::InvalidArgument(e)
            | Error::TooLarge(e)
            | Error::NoRecord(e)
            | Error::NotOwner(e)
            | Error::AlreadyCompleted(e)
            | Error::OperationReused(e)
            | Error::ReadOnly(e)
            | Error::Retry(e)
            | Error::LockTimeout(e)
            | Error::Privilege(e)
            | Error::Db(e) => Some(e),
            Error::Pool(_) | Error::Unsupported(_) | Error::UnknownOutcome(_) | Error::NoSend { .. } => None,
        }
    }

    /// The claim was lost (taken over or gone): the caller must not report success.
    pub fn lost_claim(&self) -> bool {
        matches!(self, Error::NotOwner(_) | Error::NoRecord(_))
    }

    /// Nothing was written and the same request may simply be tried again.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::Retry(_) | Error::LockTimeout(_))
    }

    /// The connection broke (the server is gone or the network failed): whether the last
    /// statement took effect is unknown.
    pub fn connection_lost(&self) -> bool {
        match self {
            Error::Db(e) => e.code().is_none() && (e.is_closed() || e.as_db_error().is_none()),
            Error::Pool(_) => true,
            _ => false,
        }
    }

    /// The SQLSTATE, or, for an error without one, its class in one word: `Closed` (the
    /// connection was closed), the kind of the I/O error under it (`ConnectionRefused`,
    /// `ConnectionReset`, ...), `PoolTimeout`, or this enum's variant.
    pub fn code_or_class(&self) -> String {
        if let Some(code) = self.sqlstate() {
            return code.to_owned();
        }
        match self {
            Error::Pool(deadpool_postgres::PoolError::Backend(e)) => class_of(e),
            Error::Pool(deadpool_postgres::PoolError::Timeout(_)) => "PoolTimeout".into(),
            Error::Pool(_) => "Pool".into(),
            Error::Unsupported(_) => "Unsupported".into(),
            Error::UnknownOutcome(_) => "UnknownOutcome".into(),
            Error::NoSend { .. } => "NoSend".into(),
            other => other.db_error().map_or_else(|| "Db".into(), class_of),
        }
    }

    /// The database could not be reached: refused, reset, closed, no pool connection in time,
    /// or the server shutting down, starting or out of connections (SQLSTATE class 08, 57P01,
    /// 57P02, 57P03, 53300). The layer answers 503 with Retry-After.
    pub fn unavailable(&self) -> bool {
        self.connection_lost() || self.sqlstate().is_some_and(unavailable_sqlstate)
    }
}

fn class_of(e: &tokio_postgres::Error) -> String {
    if let Some(code) = e.code() {
        return code.code().to_owned();
    }
    if e.is_closed() {
        return "Closed".into();
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return format!("{:?}", io.kind());
        }
        cause = c.source();
    }
    "Db".into()
}

/// SQLSTATEs of a server that cannot take the request now (the same list in every package).
pub(crate) fn unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
}

type Variant = fn(tokio_postgres::Error) -> Error;

/// SQLSTATE -> the variant a database error with it becomes (`src/contract_tests.rs` checks
/// the codes against contract/contract.json); any other code is [`Error::Db`].
pub(crate) const BY_SQLSTATE: [(&str, Variant); 12] = [
    ("22004", Error::NullArgument),
    ("22023", Error::InvalidArgument),
    ("54000", Error::TooLarge),
    ("IK001", Error::NoRecord),
    ("IK002", Error::NotOwner),
    ("IK003", Error::AlreadyCompleted),
    ("IK004", Error::OperationReused),
    ("25006", Error::ReadOnly),
    ("40001", Error::Retry),
    ("40P01", Error::Retry),
    ("55P03", Error::LockTimeout),
    ("42501", Error::Privilege),
];

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        let code = e.code().map(|c| c.code().to_owned());
        match BY_SQLSTATE.iter().find(|(c, _)| Some(*c) == code.as_deref()) {
            Some((_, variant)) => variant(e),
            None => Error::Db(e),
        }
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Error::Pool(e)
    }
}

/// The messages of an error's causes that its own message does not already hold (tokio-postgres
/// writes "error connecting to server" and keeps "Connection refused" in its source).
fn causes(mut cause: Option<&(dyn std::error::Error + 'static)>, shown: &str) -> String {
    let mut more = String::new();
    while let Some(c) = cause {
        let text = c.to_string();
        if !shown.contains(&text) && !more.contains(&text) {
            more.push_str(": ");
            more.push_str(&text);
        }
        cause = c.source();
    }
    more
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Pool(e) => {
                let text = format!("database pool: {e}");
                write!(f, "{text}{}", causes(std::error::Error::source(e), &text))
            }
            Error::Unsupported(what) => {
                write!(f, "the installed idempotency extension has no {what}")
            }
            Error::UnknownOutcome(w) => write!(f, "the extension answered an unknown word {w:?}"),
            Error::NoSend { scope, operation } => {
                write!(f, "no outbound record for operation {operation:?} in scope {scope:?}")
            }
            _ => {
                let e = self.db_error().expect("a database error");
                match (e.as_db_error(), self.sqlstate()) {
                    (Some(db), Some(code)) => write!(f, "{} ({code})", db.message()),
                    _ => {
                        let text = e.to_string();
                        write!(f, "{text}{}", causes(std::error::Error::source(e), &text))
                    }
                }
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Pool(e) => Some(e),
            _ => self.db_error().map(|e| e as &(dyn std::error::Error + 'static)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{causes, unavailable_sqlstate};

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error connecting to server")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_causes_a_message_leaves_out_are_added() {
        let e = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused"));
        assert_eq!(causes(std::error::Error::source(&e), &e.to_string()), ": Connection refused");
        assert_eq!(causes(std::error::Error::source(&e), "x: Connection refused"), "");
        assert_eq!(causes(None, "x"), "");
    }

    #[test]
    fn unavailable_sqlstates() {
        for code in ["08000", "08006", "08001", "57P01", "57P02", "57P03", "53300"] {
            assert!(unavailable_sqlstate(code), "{code}");
        }
        for code in ["40001", "55P03", "IK002", "22023", "53200", "57014"] {
            assert!(!unavailable_sqlstate(code), "{code}");
        }
    }
}
