//! The sending side (docs/sending.md in the repository): a request to another service with an
//! `Idempotency-Key` made once per business operation and kept in your database.
//!
//! [`prepare`] runs in your transaction (it never commits) and returns the key. A [`Sender`]
//! then delivers right after `COMMIT` ([`Sender::deliver`], one attempt) or runs as a worker
//! ([`Sender::run`]: retries with backoff, jitter and the retry budget, all decided by the
//! extension). HTTP goes through reqwest (feature `reqwest`) or a function of yours
//! ([`SenderBuilder::send_with`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use futures_util::future::{join4, join_all};
use serde_json::Value;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, GenericClient, Row};
use uuid::Uuid;

use crate::client::interval;
use crate::error::Error;
use crate::send_settings::{check_interval, check_timeout, reconnect_delay, setting_values};

/// The channel `idem_send` notifies when a send is committed.
pub const CHANNEL: &str = "idempotency_send";

/// The `state` of an `idempotency.outbound` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendState {
    /// Due at `next_attempt_at`.
    Pending,
    /// A sender holds it under a lease.
    Sending,
    /// The receiver gave a final answer (4xx included).
    Done,
    /// No final answer came before `give_up_at`: the outcome at the receiver is unknown.
    GaveUp,
}

impl SendState {
    pub fn parse(word: &str) -> Option<SendState> {
        Some(match word {
            "pending" => SendState::Pending,
            "sending" => SendState::Sending,
            "done" => SendState::Done,
            "gave_up" => SendState::GaveUp,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SendState::Pending => "pending",
            SendState::Sending => "sending",
            SendState::Done => "done",
            SendState::GaveUp => "gave_up",
        }
    }
}

fn state_of(row: &Row, column: &str) -> Result<SendState, Error> {
    let word: String = row.get(column);
    SendState::parse(&word).ok_or(Error::UnknownOutcome(word))
}

/// The receiver's final answer (any status that is not retried, 4xx included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub status: u16,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: Option<String>,
}

/// Where one send stands after an attempt, or when looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendResult {
    /// The receiver's final answer: read it, never resend the operation.
    Delivered(Delivered),
    /// No final answer yet: `Pending` (a retry is due at `next_attempt_at`) or `Sending`
    /// (another sender holds it now). A worker finishes it.
    NotYet {
        state: SendState,
        attempts: i32,
        next_attempt_at: Option<SystemTime>,
        last_status: Option<u16>,
        last_error: Option<String>,
    },
    /// `gave_up`: no final answer came before `give_up_at`. The receiver may or may not have
    /// done the work: look it up there by `key`; never send the operation again with a new key.
    Unknown { key: String, attempts: i32, last_status: Option<u16>, last_error: Option<String> },
    /// This sender's lease ended and another sender took the send over (IK002): this result
    /// was not recorded, the other sender's will be.
    Lost { scope: String, operation: String },
}

/// What `idem_send` recorded (or found: the same operation prepared before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub key: String,
    pub state: SendState,
    pub attempts: i32,
    pub next_attempt_at: Option<SystemTime>,
    /// The final answer, when the operation was prepared and delivered before.
    pub response: Option<Delivered>,
}

/// The optional arguments of `idem_send`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrepareOptions<'a> {
    /// Your own key (checked like an idempotency key); by default a new UUID.
    pub key: Option<&'a str>,
    /// By default `idempotency.send_give_up_after`: keep it below the receiver's retention.
    pub give_up_after: Option<Duration>,
}

/// One send handed out by `idem_send_next`.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub scope: String,
    pub operation: String,
    pub target: String,
    pub key: String,
    pub request: Option<Value>,
    /// 1 for the first attempt.
    pub attempt: i32,
    pub token: Uuid,
    pub locked_until: SystemTime,
    pub give_up_at: SystemTime,
}

/// What one attempt got: `status` None means no answer (`error` says why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub status: Option<u16>,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: Option<String>,
    pub error: Option<String>,
}

impl Answer {
    pub fn response(status: u16, headers: HashMap<String, String>, body: Option<String>) -> Answer {
        Answer { status: Some(status), headers, body, error: None }
    }

    /// Refused, reset, timed out: the request may or may not have reached the receiver.
    pub fn no_answer(error: impl Into<String>) -> Answer {
        Answer { error: Some(error.into()), ..Answer::default() }
    }
}

/// The `Idempotency-Key` header's value: an RFC 8941 sf-string.
pub fn key_header(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A longer `Retry-After` is read as this (1000 years): past any `give_up_at`, and within what
/// an interval holds.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(365_000 * 86_400);

/// `Retry-After` as delta-seconds or an HTTP date (at most [`MAX_RETRY_AFTER`]); None when
/// unreadable.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO).min(MAX_RETRY_AFTER))
}

// --- the caller's transaction ---------------------------------------------------------------

const SEND_SQL: &str = "SELECT key, state, attempts, next_attempt_at, response_status, response_body,
       response_headers FROM idempotency.idem_send($1, $2, $3, $4, $5, $6::interval)";

/// Records the send in the caller's open transaction (never commits) and returns its key.
/// Called again for the same operation it returns the same row and writes nothing.
pub async fn prepare(
    db: &impl GenericClient,
    scope: &str,
    operation: &str,
    target: &str,
    request: Option<&Value>,
    options: PrepareOptions<'_>,
) -> Result<Prepared, Error> {
    let row = db
        .query_typed_one(
            SEND_SQL,
            &[
                (&scope, Type::TEXT),
                (&operation, Type::TEXT),
                (&target, Type::TEXT),
                (&request, Type::JSONB),
                (&options.key, Type::TEXT),
                (&interval(options.give_up_after), Type::TEXT),
            ],
        )
        .await?;
    let state = state_of(&row, "state")?;
    let response = if state == SendState::Done { delivered(&row)? } else { None };
    Ok(Prepared {
        key: row.get("key"),
        state,
        attempts: row.get("attempts"),
        next_attempt_at: row.get("next_attempt_at"),
        response,
    })
}

fn status_of(row: &Row, column: &str) -> Option<u16> {
    row.get::<_, Option<i32>>(column).and_then(|s| u16::try_from(s).ok())
}

fn delivered(row: &Row) -> Result<Option<Delivered>, Error> {
    let Some(status) = status_of(row, "response_status") else { return Ok(None) };
    let headers: Option<Value> = row.get("response_headers");
    Ok(Some(Delivered { status, headers: header_map(headers.as_ref()), body: row.get("response_body") }))
}

fn header_map(headers: Option<&Value>) -> HashMap<String, String> {
    let Some(Value::Object(map)) = headers else { return HashMap::new() };
    map.iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
        .collect()
}

// --- the sender -----------------------------------------------------------------------------

type SendFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;
type SendFn = Arc<dyn Fn(Attempt) -> SendFuture + Send + Sync>;
type OnAttempt = Arc<dyn Fn(&Attempt, &Answer) + Send + Sync>;
type OnFinished = Arc<dyn Fn(&Attempt, &SendResult) + Send + Sync>;

/// The `log` target of the sender's records. The worker's database errors are WARN records
/// with the key-values `db_error` (the SQLSTATE, or the error's class: [`Error::code_or_class`])
/// and `message` (the error's first line); its reconnections INFO records with
/// `db_reconnected = true`.
pub const LOG_TARGET: &str = "pg_idempotency::sender";

const NEXT_SQL: &str =
    "SELECT scope, operation, target, key, request, attempt, token, locked_until, give_up_at
  FROM idempotency.idem_send_next(target => $1, max_rows => $2, lease => $3::interval, scope => $4,
                                  operation => $5)";
const RESULT_SQL: &str = "SELECT state, attempts, next_attempt_at
  FROM idempotency.idem_send_result($1, $2, $3, $4, $5, $6, $7::interval, $8)";
// The answers of a round, recorded in one statement (one round trip, one transaction), in the
// order given: idem_send_result once per element of the arrays.
const RESULTS_SQL: &str = "SELECT r.state, r.attempts, r.next_attempt_at
  FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int[], $5::text[], $6::jsonb[], $7::text[]::interval[],
              $8::text[])
         WITH ORDINALITY AS a(scope, operation, token, http_status, response_body, response_headers, retry_after,
                              error, n),
       LATERAL idempotency.idem_send_result(a.scope, a.operation, a.token, a.http_status, a.response_body,
                                            a.response_headers, a.retry_after, a.error) AS r
  ORDER BY a.n";
const ROW_SQL: &str = "SELECT state, attempts, next_attempt_at, last_status, last_error, response_status,
       response_body, response_headers, key FROM idempotency.outbound WHERE scope = $1 AND operation = $2";
const IDLE_SQL: &str = "SELECT NOT EXISTS (SELECT FROM idempotency.outbound
  WHERE state IN ('pending', 'sending') AND ($1::text IS NULL OR target = $1))";

/// What idem_send_result gets for an answer besides the attempt, the body and the error: the
/// status, the headers (when there is an answer) and Retry-After (as interval text).
fn result_values(answer: &Answer) -> (Option<i32>, Option<Value>, Option<String>) {
    let status = answer.status.map(i32::from);
    let headers = answer.status.map(|_| {
        Value::Object(answer.headers.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
    });
    let retry_after = answer
        .status
        .and_then(|_| answer.headers.get("retry-after"))
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    (status, headers, interval(retry_after))
}

/// A round's answers, column by column (RESULTS_SQL's arrays).
#[derive(Default)]
struct RoundColumns<'a> {
    scope: Vec<&'a str>,
    operation: Vec<&'a str>,
    token: Vec<Uuid>,
    status: Vec<Option<i32>>,
    body: Vec<Option<&'a str>>,
    headers: Vec<Option<Value>>,
    retry_after: Vec<Option<String>>,
    error: Vec<Option<&'a str>>,
}

/// Sends due requests: [`deliver`](Sender::deliver) (one operation, right after COMMIT) and
/// [`run`](Sender::run) (a worker). Built with [`Sender::builder`]. Cheap to clone.
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    listen: Option<tokio_postgres::Config>,
    send: SendFn,
    timeout: Duration,
    lease: Duration,
    /// `set_config(name, value, true)` in each transaction of idem_send_next / idem_send_result.
    settings: Vec<(&'static str, String)>,
    give_up_after: Option<Duration>,
    reconnect: (Duration, Duration),
    concurrency: usize,
    poll_interval: Duration,
    on_attempt: Option<OnAttempt>,
    on_finished: Option<OnFinished>,
    /// Answers the database went away before recording (the worker records them once back).
    unrecorded: std::sync::Mutex<Vec<Unrecorded>>,
}

/// An attempt's answer not recorded yet; `lease_end` is at or before the end of its lease.
struct Unrecorded {
    attempt: Attempt,
    answer: Answer,
    lease_end: Instant,
}

/// The settings of a [`Sender`].
pub struct SenderBuilder {
    pool: Pool,
    listen: Option<tokio_postgres::Config>,
    send: Option<SendFn>,
    #[cfg(feature = "reqwest")]
    urls: HashMap<String, String>,
    #[cfg(feature = "reqwest")]
    headers: HashMap<String, Vec<(String, String)>>,
    timeout: Duration,
    lease: Duration,
    retry_budget: Option<f64>,
    backoff_base: Option<Duration>,
    backoff_cap: Option<Duration>,
    give_up_after: Option<Duration>,
    reconnect: (Duration, Duration),
    concurrency: usize,
    poll_interval: Duration,
    on_attempt: Option<OnAttempt>,
    on_finished: Option<OnFinished>,
}

/// A [`SenderBuilder`] that cannot build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// Neither a URL per target nor a send function was given.
    NoTransport,
    /// The attempt's timeout must be above zero and shorter than the lease a sender holds a
    /// send for.
    TimeoutNotBelowLease(String),
    /// A setting out of the extension's range (the message says which).
    Setting(String),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::NoTransport => f.write_str("give a URL per target or a send function"),
            BuildError::TimeoutNotBelowLease(why) | BuildError::Setting(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for BuildError {}

impl SenderBuilder {
    /// Where the worker `LISTEN`s for committed sends: a direct connection (not through
    /// PgBouncer's transaction pooling), without TLS. Without it the worker polls only.
    pub fn listen(mut self, config: tokio_postgres::Config) -> Self {
        self.listen = Some(config);
        self
    }

    /// POST the requests of `target` to `url` (the request as JSON).
    #[cfg(feature = "reqwest")]
    pub fn url(mut self, target: &str, url: &str) -> Self {
        self.urls.insert(target.to_owned(), url.to_owned());
        self
    }

    /// An extra header on every request to `target` (its credentials, say).
    #[cfg(feature = "reqwest")]
    pub fn header(mut self, target: &str, name: &str, value: &str) -> Self {
        self.headers.entry(target.to_owned()).or_default().push((name.to_owned(), value.to_owned()));
        self
    }

    /// Your own transport: an [`Attempt`] in, an [`Answer`] out (never an error: return
    /// [`Answer::no_answer`] when no answer came). Send `key_header(&attempt.key)` as the
    /// `Idempotency-Key` header. The sender's timeout bounds it as it bounds its own HTTP.
    pub fn send_with<F, Fut>(mut self, send: F) -> Self
    where
        F: Fn(Attempt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answer> + Send + 'static,
    {
        self.send = Some(Arc::new(move |a| Box::pin(send(a))));
        self
    }

    /// Bounds one attempt in total, from connecting to the whole answer (default 10 s); must be
    /// below the lease.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a sender holds a send before another may take it over (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// This sender's retry budget (`idempotency.send_retry_budget`, 0 to 1,000,000; 0: no
    /// retries), set in each of its transactions; by default the database's.
    pub fn retry_budget(mut self, budget: f64) -> Self {
        self.retry_budget = Some(budget);
        self
    }

    /// This sender's first backoff bound (`idempotency.send_backoff_base`), set in each of its
    /// transactions; by default the database's.
    pub fn backoff_base(mut self, base: Duration) -> Self {
        self.backoff_base = Some(base);
        self
    }

    /// This sender's largest backoff bound (`idempotency.send_backoff_cap`), set in each of its
    /// transactions; by default the database's.
    pub fn backoff_cap(mut self, cap: Duration) -> Self {
        self.backoff_cap = Some(cap);
        self
    }

    /// How long [`Sender::prepare`] gives a send (`idem_send`'s `give_up_after`); by default
    /// the database's `idempotency.send_give_up_after`.
    pub fn give_up_after(mut self, after: Duration) -> Self {
        self.give_up_after = Some(after);
        self
    }

    /// The worker's waits between reconnections after database errors: full jitter up to
    /// `base * 2^(errors in a row - 1)`, at most `cap` (default 100 ms and 5 s).
    pub fn reconnect(mut self, base: Duration, cap: Duration) -> Self {
        self.reconnect = (base, cap);
        self
    }

    /// Sends attempted at once by the worker (default 4).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How often the worker looks for retries that became due (default 1 s).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Called after each attempt with what it got.
    pub fn on_attempt(mut self, f: impl Fn(&Attempt, &Answer) + Send + Sync + 'static) -> Self {
        self.on_attempt = Some(Arc::new(f));
        self
    }

    /// Called when an attempt's result finished the send (delivered, or gave up).
    pub fn on_finished(mut self, f: impl Fn(&Attempt, &SendResult) + Send + Sync + 'static) -> Self {
        self.on_finished = Some(Arc::new(f));
        self
    }

    pub fn build(self) -> Result<Sender, BuildError> {
        check_timeout(self.timeout, self.lease).map_err(|e| BuildError::TimeoutNotBelowLease(e.0))?;
        let settings = setting_values(self.retry_budget, self.backoff_base, self.backoff_cap)
            .map_err(|e| BuildError::Setting(e.0))?;
        let give_up_after = self
            .give_up_after
            .map(|d| check_interval("give_up_after", d))
            .transpose()
            .map_err(|e| BuildError::Setting(e.0))?;
        let send = match self.send {
            Some(send) => send,
            #[cfg(feature = "reqwest")]
            None if !self.urls.is_empty() => http::transport(self.urls, self.headers, self.timeout),
            None => return Err(BuildError::NoTransport),
        };
        Ok(Sender {
            inner: Arc::new(Inner {
                pool: self.pool,
                listen: self.listen,
                send,
                timeout: self.timeout,
                lease: self.lease,
                settings,
                give_up_after,
                reconnect: self.reconnect,
                concurrency: self.concurrency,
                poll_interval: self.poll_interval,
                on_attempt: self.on_attempt,
                on_finished: self.on_finished,
                unrecorded: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }
}

/// What one round of the worker came to.
enum Round {
    /// It attempted sends: look again at once.
    Worked,
    /// Nothing was due.
    Idle,
    /// `until_idle` and nothing of the target is pending or sending.
    Finished,
}

impl Sender {
    /// A sender whose database calls go through `pool`.
    pub fn builder(pool: Pool) -> SenderBuilder {
        SenderBuilder {
            pool,
            listen: None,
            send: None,
            #[cfg(feature = "reqwest")]
            urls: HashMap::new(),
            #[cfg(feature = "reqwest")]
            headers: HashMap::new(),
            timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            retry_budget: None,
            backoff_base: None,
            backoff_cap: None,
            give_up_after: None,
            reconnect: (Duration::from_millis(100), Duration::from_secs(5)),
            concurrency: 4,
            poll_interval: Duration::from_secs(1),
            on_attempt: None,
            on_finished: None,
        }
    }

    /// [`prepare`], with this sender's `give_up_after` when `options` gives none.
    pub async fn prepare(
        &self,
        db: &impl GenericClient,
        scope: &str,
        operation: &str,
        target: &str,
        request: Option<&Value>,
        options: PrepareOptions<'_>,
    ) -> Result<Prepared, Error> {
        let options =
            PrepareOptions { give_up_after: options.give_up_after.or(self.inner.give_up_after), ..options };
        prepare(db, scope, operation, target, request, options).await
    }

    /// One call of the extension, with this sender's settings: without any, one autocommit
    /// statement; with them, `BEGIN`, `set_config(..., true)`, the call and `COMMIT` sent at
    /// once (one round trip; a failed call makes the COMMIT a rollback), so they hold for that
    /// transaction only, through PgBouncer in transaction mode too.
    async fn call(&self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<Vec<Row>, Error> {
        let db = self.inner.pool.get().await?;
        if self.inner.settings.is_empty() {
            return Ok(db.query_typed(sql, params).await?);
        }
        let set = (0..self.inner.settings.len())
            .map(|i| format!("set_config(${}, ${}, true)", 2 * i + 1, 2 * i + 2))
            .collect::<Vec<_>>()
            .join(", ");
        let set = format!("SELECT {set}");
        let values: Vec<(&(dyn ToSql + Sync), Type)> = self
            .inner
            .settings
            .iter()
            .flat_map(|(name, value)| [(name as &(dyn ToSql + Sync), Type::TEXT), (value as _, Type::TEXT)])
            .collect();
        let (begun, set, called, committed) = join4(
            db.batch_execute("BEGIN"),
            db.query_typed(&set, &values),
            db.query_typed(sql, params),
            db.batch_execute("COMMIT"),
        )
        .await;
        begun?;
        set?;
        let rows = called?;
        committed?;
        Ok(rows)
    }

    /// Right after the COMMIT that prepared it: one attempt of this send, if it is due and no
    /// other sender holds it; otherwise (or after a retryable answer) where it is now. The
    /// retries are the worker's. [`Error::NoSend`] when the operation was never prepared (or
    /// its transaction rolled back). A database error is returned (the worker takes the send
    /// again when its lease ends).
    pub async fn deliver(&self, scope: &str, operation: &str) -> Result<SendResult, Error> {
        match self.take(None, 1, Some(scope), Some(operation)).await?.0.pop() {
            Some(taken) => self.attempt(taken).await,
            None => self
                .status(scope, operation)
                .await?
                .ok_or_else(|| Error::NoSend { scope: scope.to_owned(), operation: operation.to_owned() }),
        }
    }

    /// Where the send is now, from its row; None when there is no such send.
    pub async fn status(&self, scope: &str, operation: &str) -> Result<Option<SendResult>, Error> {
        let db = self.inner.pool.get().await?;
        let Some(row) =
            db.query_typed_opt(ROW_SQL, &[(&scope, Type::TEXT), (&operation, Type::TEXT)]).await?
        else {
            return Ok(None);
        };
        let state = state_of(&row, "state")?;
        let attempts = row.get("attempts");
        let (last_status, last_error) = (status_of(&row, "last_status"), row.get("last_error"));
        Ok(Some(match state {
            SendState::Done => match delivered(&row)? {
                Some(d) => SendResult::Delivered(d),
                None => return Err(Error::UnknownOutcome("done without a response_status".into())),
            },
            SendState::GaveUp => {
                SendResult::Unknown { key: row.get("key"), attempts, last_status, last_error }
            }
            state => SendResult::NotYet {
                state,
                attempts,
                next_attempt_at: row.get("next_attempt_at"),
                last_status,
                last_error,
            },
        }))
    }

    /// The answer to one attempt, within the sender's timeout from connecting to the whole
    /// answer (after it: no answer, "timed out"; the connection is dropped).
    async fn answer(&self, attempt: &Attempt) -> Answer {
        let answer = match tokio::time::timeout(self.inner.timeout, (self.inner.send)(attempt.clone())).await
        {
            Ok(answer) => answer,
            Err(_) => Answer::no_answer("timed out"),
        };
        if let Some(f) = &self.inner.on_attempt {
            f(attempt, &answer);
        }
        answer
    }

    /// One attempt of a send this sender holds, and its result recorded.
    pub async fn attempt(&self, attempt: Attempt) -> Result<SendResult, Error> {
        let answer = self.answer(&attempt).await;
        self.record(&attempt, &answer).await
    }

    async fn record(&self, attempt: &Attempt, answer: &Answer) -> Result<SendResult, Error> {
        let (status, headers, retry_after) = result_values(answer);
        let rows = self
            .call(
                RESULT_SQL,
                &[
                    (&attempt.scope, Type::TEXT),
                    (&attempt.operation, Type::TEXT),
                    (&attempt.token, Type::UUID),
                    (&status, Type::INT4),
                    (&answer.body, Type::TEXT),
                    (&headers, Type::JSONB),
                    (&retry_after, Type::TEXT),
                    (&answer.error, Type::TEXT),
                ],
            )
            .await;
        let row = match rows {
            Err(Error::NotOwner(_)) => {
                return Ok(SendResult::Lost {
                    scope: attempt.scope.clone(),
                    operation: attempt.operation.clone(),
                })
            }
            // Recorded already: the COMMIT's answer was lost with the connection.
            Err(Error::AlreadyCompleted(_)) => {
                return self.status(&attempt.scope, &attempt.operation).await?.ok_or_else(|| Error::NoSend {
                    scope: attempt.scope.clone(),
                    operation: attempt.operation.clone(),
                })
            }
            other => other?.into_iter().next().ok_or(Error::UnknownOutcome("no row".into()))?,
        };
        self.recorded(attempt, answer, &row)
    }

    /// The result of an answer that idem_send_result recorded (`row`: its state, attempts and
    /// next_attempt_at).
    fn recorded(&self, attempt: &Attempt, answer: &Answer, row: &Row) -> Result<SendResult, Error> {
        let (attempts, last_status, last_error) = (row.get("attempts"), answer.status, answer.error.clone());
        let result = match state_of(row, "state")? {
            SendState::Done => SendResult::Delivered(Delivered {
                status: answer.status.unwrap_or_default(),
                headers: answer.headers.clone(),
                body: answer.body.clone(),
            }),
            SendState::GaveUp => {
                SendResult::Unknown { key: attempt.key.clone(), attempts, last_status, last_error }
            }
            state => SendResult::NotYet {
                state,
                attempts,
                next_attempt_at: row.get("next_attempt_at"),
                last_status,
                last_error,
            },
        };
        if let (Some(f), false) = (&self.inner.on_finished, matches!(result, SendResult::NotYet { .. })) {
            f(attempt, &result);
        }
        Ok(result)
    }

    /// The answers of a round, recorded together (`done`: each attempt with its answer): one
    /// statement, so one round trip and one transaction, in (scope, operation) order (so that
    /// two senders never lock rows in opposite orders). When the extension refuses one of them
    /// (IK002: its lease was lost; IK003: recorded already) the statement records none, and each
    /// is recorded on its own. The results are in `done`'s order.
    async fn record_round(&self, done: &[(Attempt, Answer)]) -> Result<Vec<SendResult>, Error> {
        let mut order: Vec<usize> = (0..done.len()).collect();
        order.sort_by(|&x, &y| {
            let (a, b) = (&done[x].0, &done[y].0);
            (&a.scope, &a.operation).cmp(&(&b.scope, &b.operation))
        });
        let mut columns = RoundColumns::default();
        for &i in &order {
            let (a, answer) = &done[i];
            let (status, headers, retry_after) = result_values(answer);
            columns.scope.push(a.scope.as_str());
            columns.operation.push(a.operation.as_str());
            columns.token.push(a.token);
            columns.status.push(status);
            columns.body.push(answer.body.as_deref());
            columns.headers.push(headers);
            columns.retry_after.push(retry_after);
            columns.error.push(answer.error.as_deref());
        }
        let rows = self
            .call(
                RESULTS_SQL,
                &[
                    (&columns.scope, Type::TEXT_ARRAY),
                    (&columns.operation, Type::TEXT_ARRAY),
                    (&columns.token, Type::UUID_ARRAY),
                    (&columns.status, Type::INT4_ARRAY),
                    (&columns.body, Type::TEXT_ARRAY),
                    (&columns.headers, Type::JSONB_ARRAY),
                    (&columns.retry_after, Type::TEXT_ARRAY),
                    (&columns.error, Type::TEXT_ARRAY),
                ],
            )
            .await;
        let mut results: Vec<Option<SendResult>> = (0..done.len()).map(|_| None).collect();
        match rows {
            Err(Error::NotOwner(_) | Error::AlreadyCompleted(_)) => {
                for &i in &order {
                    results[i] = Some(self.record(&done[i].0, &done[i].1).await?);
                }
            }
            Err(e) => return Err(e),
            Ok(rows) if rows.len() != order.len() => {
                return Err(Error::UnknownOutcome(format!(
                    "{} answers recorded, {} results returned",
                    order.len(),
                    rows.len()
                )))
            }
            Ok(rows) => {
                for (&i, row) in order.iter().zip(&rows) {
                    results[i] = Some(self.recorded(&done[i].0, &done[i].1, row)?);
                }
            }
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// Due sends, and an instant at or before the end of their lease (it began at the
    /// transaction's now(), after this instant).
    async fn take(
        &self,
        target: Option<&str>,
        max_rows: usize,
        scope: Option<&str>,
        operation: Option<&str>,
    ) -> Result<(Vec<Attempt>, Instant), Error> {
        let before = Instant::now();
        let max_rows = i32::try_from(max_rows).unwrap_or(i32::MAX);
        let rows = self
            .call(
                NEXT_SQL,
                &[
                    (&target, Type::TEXT),
                    (&max_rows, Type::INT4),
                    (&interval(Some(self.inner.lease)), Type::TEXT),
                    (&scope, Type::TEXT),
                    (&operation, Type::TEXT),
                ],
            )
            .await?;
        let taken = rows
            .iter()
            .map(|r| Attempt {
                scope: r.get("scope"),
                operation: r.get("operation"),
                target: r.get("target"),
                key: r.get("key"),
                request: r.get("request"),
                attempt: r.get("attempt"),
                token: r.get("token"),
                locked_until: r.get("locked_until"),
                give_up_at: r.get("give_up_at"),
            })
            .collect();
        Ok((taken, before + self.inner.lease))
    }

    /// One round: takes up to `concurrency` due sends of `target` (of any: None), attempts
    /// them at once and, once every attempt has ended, records their answers together (one
    /// statement, one round trip; a round of one: the single call). Returns how many it
    /// attempted. A database error is returned; the answers it kept from being recorded are
    /// recorded by the worker ([`run`](Sender::run)) once it has reconnected, while their lease
    /// holds.
    pub async fn run_once(&self, target: Option<&str>) -> Result<usize, Error> {
        let (taken, lease_end) = self.take(target, self.inner.concurrency, None, None).await?;
        let n = taken.len();
        let answers = join_all(taken.iter().map(|a| self.answer(a))).await;
        let done: Vec<(Attempt, Answer)> = taken.into_iter().zip(answers).collect();
        let recorded = match done.as_slice() {
            [] => return Ok(0),
            [(a, answer)] => self.record(a, answer).await.map(drop),
            several => self.record_round(several).await.map(drop),
        };
        if let Err(e) = recorded {
            let mut unrecorded = self.inner.unrecorded.lock().unwrap();
            unrecorded.extend(done.into_iter().map(|(attempt, answer)| Unrecorded {
                attempt,
                answer,
                lease_end,
            }));
            return Err(e);
        }
        Ok(n)
    }

    /// Records the answers a database error kept from being recorded, those whose lease still
    /// holds (the others are left to be taken again, with the same key).
    async fn record_unrecorded(&self) -> Result<(), Error> {
        let kept = std::mem::take(&mut *self.inner.unrecorded.lock().unwrap());
        let mut kept = kept.into_iter();
        while let Some(u) = kept.next() {
            let a = &u.attempt;
            if Instant::now() >= u.lease_end {
                log::info!(
                    target: LOG_TARGET,
                    "the answer to {} / {} (attempt {}) was not recorded before its lease ended: the send is left to be taken again",
                    a.scope, a.operation, a.attempt
                );
                continue;
            }
            if let Err(e) = self.record(a, &u.answer).await {
                let mut unrecorded = self.inner.unrecorded.lock().unwrap();
                unrecorded.push(u);
                unrecorded.extend(kept);
                return Err(e);
            }
            log::info!(
                target: LOG_TARGET,
                "recorded the answer to {} / {} (attempt {}) after reconnecting",
                a.scope, a.operation, a.attempt
            );
        }
        Ok(())
    }

    /// No send of `target` (of any target: None) is pending or sending.
    pub async fn idle(&self, target: Option<&str>) -> Result<bool, Error> {
        let db = self.inner.pool.get().await?;
        Ok(db.query_typed_one(IDLE_SQL, &[(&target, Type::TEXT)]).await?.get(0))
    }

    /// The worker: rounds of [`run_once`](Sender::run_once) while there is due work; between
    /// them it waits for a NOTIFY on `idempotency_send` (with [`SenderBuilder::listen`]) or
    /// the poll interval, whichever first. Returns when `shutdown` completes (after the
    /// attempts in flight are recorded) or, with `until_idle`, when nothing of the target is
    /// left to send.
    ///
    /// A database error (the backend terminated, the server restarting or down, a failover,
    /// a deadlock, a serialization failure) does not end it: it is logged (`log`, target
    /// [`LOG_TARGET`], WARN with the key-values `db_error` and `message`), its LISTEN session
    /// is dropped, and after a wait of exponential backoff with full jitter
    /// ([`SenderBuilder::reconnect`]) the worker reconnects (INFO, `db_reconnected = true`),
    /// records the answers the error kept from being recorded while their lease holds, and
    /// goes on.
    pub async fn run(
        &self,
        target: Option<&str>,
        until_idle: bool,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let wake = Arc::new(Notify::new());
        let (stop_tx, mut stop) = watch::channel(false);
        let stopper = {
            let wake = wake.clone();
            tokio::spawn(async move {
                shutdown.await;
                let _ = stop_tx.send(true);
                wake.notify_one();
            })
        };
        let mut listener: Option<Listener> = None;
        let (mut failures, mut connected) = (0u32, false);
        while !*stop.borrow() {
            let round = async {
                if !connected {
                    if let Some(config) = &self.inner.listen {
                        listener = Some(Listener::start(config, wake.clone()).await?);
                    } else {
                        self.inner.pool.get().await?.batch_execute("").await?;
                    }
                    connected = true;
                    if failures > 0 {
                        log::info!(target: LOG_TARGET, db_reconnected = true; "reconnected to the database");
                    }
                    self.record_unrecorded().await?;
                }
                if let Some(l) = &listener {
                    l.check().await?;
                }
                if self.run_once(target).await? > 0 {
                    return Ok(Round::Worked);
                }
                if until_idle && self.idle(target).await? {
                    return Ok(Round::Finished);
                }
                Ok::<_, Error>(Round::Idle)
            }
            .await;
            match round {
                Ok(Round::Worked) => failures = 0,
                Ok(Round::Finished) => break,
                Ok(Round::Idle) => {
                    failures = 0;
                    let _ = tokio::time::timeout(self.inner.poll_interval, wake.notified()).await;
                }
                Err(e) => {
                    failures += 1;
                    let (base, cap) = self.inner.reconnect;
                    let delay = reconnect_delay(failures, base, cap, rand::random::<f64>());
                    let (code, line) = (e.code_or_class(), first_line(&e));
                    log::warn!(
                        target: LOG_TARGET,
                        db_error = code.as_str(), message = line.as_str();
                        "database error ({code}): {line}; reconnecting in {delay:?}"
                    );
                    listener = None;
                    connected = false;
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.wait_for(|stopped| *stopped) => {}
                    }
                }
            }
        }
        stopper.abort();
    }
}

/// The first line of an error's message (for a log line of its own).
fn first_line(e: &Error) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or("").trim().to_owned()
}

/// A session that LISTENs on [`CHANNEL`] and wakes the worker on each notification. Its
/// messages are read by a task of its own, dropped with it.
struct Listener {
    client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<()>,
    /// The error that ended the session, if one did.
    failed: Arc<std::sync::Mutex<Option<tokio_postgres::Error>>>,
}

impl Listener {
    async fn start(config: &tokio_postgres::Config, wake: Arc<Notify>) -> Result<Listener, Error> {
        let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
        let failed = Arc::new(std::sync::Mutex::new(None));
        let ended = failed.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        *ended.lock().unwrap() = Some(e);
                        break;
                    }
                }
            }
            wake.notify_one(); // the session ended: the worker finds out at once
        });
        let listener = Listener { client, task, failed };
        listener.client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok(listener)
    }

    /// The error that ended the session, if it ended.
    async fn check(&self) -> Result<(), Error> {
        if let Some(e) = self.failed.lock().unwrap().take() {
            return Err(e.into());
        }
        if self.client.is_closed() {
            self.client.batch_execute("").await?; // the client's own "closed" error
        }
        Ok(())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(feature = "reqwest")]
mod http {
    use super::*;

    pub(super) fn transport(
        urls: HashMap<String, String>,
        headers: HashMap<String, Vec<(String, String)>>,
        timeout: Duration,
    ) -> SendFn {
        let client = reqwest::Client::builder().timeout(timeout).build().expect("an HTTP client");
        let (urls, headers) = (Arc::new(urls), Arc::new(headers));
        Arc::new(move |attempt: Attempt| {
            let (client, urls, headers) = (client.clone(), urls.clone(), headers.clone());
            Box::pin(async move { post(&client, &urls, &headers, attempt).await })
        })
    }

    async fn post(
        client: &reqwest::Client,
        urls: &HashMap<String, String>,
        headers: &HashMap<String, Vec<(String, String)>>,
        attempt: Attempt,
    ) -> Answer {
        let Some(url) = urls.get(&attempt.target) else {
            return Answer::no_answer(format!("no URL for target {}", attempt.target));
        };
        let body = serde_json::to_vec(&attempt.request.unwrap_or(Value::Null)).expect("JSON");
        let mut request = client
            .post(url)
            .header("Idempotency-Key", key_header(&attempt.key))
            .header("Content-Type", "application/json")
            .body(body);
        for (name, value) in headers.get(&attempt.target).into_iter().flatten() {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Answer::no_answer("timed out"),
            Err(e) if e.is_connect() => return Answer::no_answer(format!("connection failed: {e}")),
            Err(e) => return Answer::no_answer(format!("no answer: {e}")),
        };
        let status = response.status().as_u16();
        let mut names: HashMap<String, String> = HashMap::new();
        for (name, value) in response.headers() {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            names
                .entry(name.as_str().to_owned())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
        match response.text().await {
            Ok(body) => Answer::response(status, names, Some(body)),
            Err(e) if e.is_timeout() => Answer::no_answer("timed out"),
            Err(e) => Answer::no_answer(format!("no answer: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_header_is_an_sf_string() {
        assert_eq!(key_header("abc-1"), r#""abc-1""#);
        assert_eq!(key_header(r#"a"b\c"#), r#""a\"b\\c""#);
        // sfv reads back what it wrote.
        let parsed = crate::key::parse(&[key_header(r#"x "y" \z"#).as_bytes()]).unwrap();
        assert_eq!(parsed, r#"x "y" \z"#);
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("99999999999999999999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("99999999999", now), Some(MAX_RETRY_AFTER));
        for bad in ["", "soon", "-5", "1.5"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn states_round_trip() {
        for s in [SendState::Pending, SendState::Sending, SendState::Done, SendState::GaveUp] {
            assert_eq!(SendState::parse(s.as_str()), Some(s));
        }
        assert_eq!(SendState::parse("failed"), None);
    }

    #[test]
    fn stored_headers_become_a_lower_case_map() {
        let h = header_map(Some(&serde_json::json!({"Content-Type": "application/json", "X-N": 3})));
        assert_eq!(h.get("content-type").map(String::as_str), Some("application/json"));
        assert_eq!(h.get("x-n").map(String::as_str), Some("3"));
        assert!(header_map(None).is_empty());
    }
}
