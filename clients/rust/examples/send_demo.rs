//! The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a
//! receiver with an Idempotency-Key made once, in the order's transaction.
//!
//! ```text
//! cargo run --features reqwest --example send_demo -- prepare COUNT PREFIX
//! cargo run --features reqwest --example send_demo -- work [--until-idle] [--concurrency N]
//! cargo run --features reqwest --example send_demo -- inline COUNT PREFIX
//! ```
//!
//! Environment: DATABASE_URL, RECEIVER_URL, TARGET (receiver), SEND_LEASE_MS (30000),
//! SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo), and the sender's own
//! settings when set: SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS,
//! SEND_GIVE_UP_AFTER_MS.
//!
//! A sender the crate refuses (SEND_TIMEOUT_MS >= SEND_LEASE_MS, a bad setting) prints
//! `refused MESSAGE` and exits 2. The worker prints `db-error CLASS_OR_SQLSTATE MESSAGE` for each
//! database error its loop meets and `db-reconnected` when it works again: the crate's `log`
//! records (target pg_idempotency::sender, key-values db_error / db_reconnected), printed by
//! the logger below.

use std::env;
use std::time::Duration;

use clap::{Parser, Subcommand};
use deadpool_postgres::{Manager, Pool};
use log::kv::Key;
use pg_idempotency::sender::{PrepareOptions, SendResult, Sender, LOG_TARGET};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

const SCOPE: &str = "send-demo";
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL,
    payment_key text NOT NULL)";

#[derive(Parser)]
struct Options {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// COUNT orders, each with its send, one transaction each.
    Prepare { count: i32, prefix: String },
    /// The worker for $TARGET.
    Work {
        #[arg(long)]
        until_idle: bool,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
    },
    /// Prepare, then deliver right after each COMMIT.
    Inline { count: i32, prefix: String },
}

fn describe(result: &SendResult) -> (String, String) {
    match result {
        SendResult::Delivered(d) => ("done".into(), d.status.to_string()),
        SendResult::Unknown { .. } => ("gave_up".into(), "unknown".into()),
        SendResult::NotYet { state, .. } => (state.as_str().into(), "unknown".into()),
        SendResult::Lost { .. } => ("lost".into(), "unknown".into()),
    }
}

/// A number of milliseconds from the environment, when set.
fn env_ms(name: &str) -> Result<Option<Duration>, String> {
    match env::var(name) {
        Ok(v) => {
            v.parse().map(|ms| Some(Duration::from_millis(ms))).map_err(|e| format!("{name}={v:?}: {e}"))
        }
        Err(_) => Ok(None),
    }
}

/// The protocol's lines from the crate's log records; the other records of level INFO and
/// above go to stderr.
struct ProtocolLines;

impl log::Log for ProtocolLines {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let kv = record.key_values();
        match (record.target(), kv.get(Key::from("db_error")), kv.get(Key::from("db_reconnected"))) {
            (LOG_TARGET, Some(code), _) => {
                let message = kv.get(Key::from("message")).map(|m| m.to_string()).unwrap_or_default();
                println!("db-error {code} {message}");
            }
            (LOG_TARGET, None, Some(_)) => println!("db-reconnected"),
            _ => eprintln!("{} {}: {}", record.level(), record.target(), record.args()),
        }
    }

    fn flush(&self) {}
}

/// COUNT orders, each in one transaction with its send, delivered after its COMMIT when asked.
async fn prepare_orders(
    pool: &Pool,
    sender: &Sender,
    target: &str,
    count: i32,
    prefix: &str,
    deliver: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut db = pool.get().await?;
    db.batch_execute(SCHEMA).await?;
    for i in 1..=count {
        let order = format!("{prefix}-{i}");
        let operation = format!("{order}:charge");
        let tx = db.transaction().await?;
        let request = json!({"amount": i, "currency": "eur"});
        let sent = sender
            .prepare(&*tx, SCOPE, &operation, target, Some(&request), PrepareOptions::default())
            .await?;
        tx.execute(
            "INSERT INTO send_demo_orders VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
            &[&order, &i, &sent.key],
        )
        .await?;
        tx.commit().await?;
        if deliver {
            let (state, status) = describe(&sender.deliver(SCOPE, &operation).await?);
            println!("delivered {operation} {state} {status}");
        }
    }
    Ok(())
}

/// The sender the environment describes, or why the crate refuses it.
fn sender(
    pool: &Pool,
    config: tokio_postgres::Config,
    target: &str,
    concurrency: usize,
) -> Result<Sender, String> {
    let receiver = env::var("RECEIVER_URL").map_err(|_| "RECEIVER_URL is not set".to_owned())?;
    let api_key = env::var("RECEIVER_API_KEY").unwrap_or_else(|_| "send-demo".into());
    let mut builder = Sender::builder(pool.clone())
        .listen(config)
        .url(target, &receiver)
        .header(target, "X-Api-Key", &api_key)
        .lease(env_ms("SEND_LEASE_MS")?.unwrap_or(Duration::from_secs(30)))
        .timeout(env_ms("SEND_TIMEOUT_MS")?.unwrap_or(Duration::from_secs(10)))
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(200))
        .on_attempt(|a, answer| {
            let status = answer.status.map_or_else(|| "none".to_owned(), |s| s.to_string());
            println!("attempt {} {} {status}", a.operation, a.attempt);
        })
        .on_finished(|a, result| {
            let (state, status) = describe(result);
            println!("finished {} {state} {status}", a.operation);
        });
    if let Ok(budget) = env::var("SEND_RETRY_BUDGET") {
        builder =
            builder.retry_budget(budget.parse().map_err(|e| format!("SEND_RETRY_BUDGET={budget:?}: {e}"))?);
    }
    if let Some(base) = env_ms("SEND_BACKOFF_BASE_MS")? {
        builder = builder.backoff_base(base);
    }
    if let Some(cap) = env_ms("SEND_BACKOFF_CAP_MS")? {
        builder = builder.backoff_cap(cap);
    }
    if let Some(after) = env_ms("SEND_GIVE_UP_AFTER_MS")? {
        builder = builder.give_up_after(after);
    }
    builder.build().map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    log::set_logger(&ProtocolLines).map(|()| log::set_max_level(log::LevelFilter::Info))?;
    let options = Options::parse();
    let url = env::var("DATABASE_URL")?;
    let config: tokio_postgres::Config = url.parse()?;
    let pool = Pool::builder(Manager::new(config.clone(), tokio_postgres::NoTls)).max_size(8).build()?;
    let target = env::var("TARGET").unwrap_or_else(|_| "receiver".into());
    let concurrency = match options.command {
        Command::Work { concurrency, .. } => concurrency,
        _ => 4,
    };
    let sender = match sender(&pool, config, &target, concurrency) {
        Ok(sender) => sender,
        Err(why) => {
            println!("refused {why}");
            std::process::exit(2);
        }
    };
    match options.command {
        Command::Prepare { count, prefix } => {
            prepare_orders(&pool, &sender, &target, count, &prefix, false).await?;
            println!("prepared {count}");
        }
        Command::Inline { count, prefix } => {
            prepare_orders(&pool, &sender, &target, count, &prefix, true).await?
        }
        Command::Work { until_idle, .. } => {
            let mut term = signal(SignalKind::terminate())?;
            let shutdown = async move {
                term.recv().await;
            };
            sender.run(Some(&target), until_idle, shutdown).await;
        }
    }
    Ok(())
}
