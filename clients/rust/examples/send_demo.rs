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
//! SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo).

use std::env;
use std::time::Duration;

use clap::{Parser, Subcommand};
use deadpool_postgres::{Manager, Pool};
use pg_idempotency::sender::{prepare, PrepareOptions, SendResult, Sender};
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

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

/// COUNT orders, each in one transaction with its send, delivered after its COMMIT when a sender is given.
async fn prepare_orders(
    pool: &Pool,
    target: &str,
    count: i32,
    prefix: &str,
    sender: Option<&Sender>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut db = pool.get().await?;
    db.batch_execute(SCHEMA).await?;
    for i in 1..=count {
        let order = format!("{prefix}-{i}");
        let operation = format!("{order}:charge");
        let tx = db.transaction().await?;
        let request = json!({"amount": i, "currency": "eur"});
        let sent =
            prepare(&*tx, SCOPE, &operation, target, Some(&request), PrepareOptions::default()).await?;
        tx.execute(
            "INSERT INTO send_demo_orders VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
            &[&order, &i, &sent.key],
        )
        .await?;
        tx.commit().await?;
        if let Some(sender) = sender {
            let (state, status) = describe(&sender.deliver(SCOPE, &operation).await?);
            println!("delivered {operation} {state} {status}");
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let url = env::var("DATABASE_URL")?;
    let config: tokio_postgres::Config = url.parse()?;
    let pool = Pool::builder(Manager::new(config.clone(), tokio_postgres::NoTls)).max_size(8).build()?;
    let target = env::var("TARGET").unwrap_or_else(|_| "receiver".into());
    let concurrency = match options.command {
        Command::Prepare { count, ref prefix } => {
            prepare_orders(&pool, &target, count, prefix, None).await?;
            println!("prepared {count}");
            return Ok(());
        }
        Command::Work { concurrency, .. } => concurrency,
        Command::Inline { .. } => 4,
    };
    let sender = Sender::builder(pool.clone())
        .listen(config)
        .url(&target, &env::var("RECEIVER_URL")?)
        .header(&target, "X-Api-Key", &env::var("RECEIVER_API_KEY").unwrap_or_else(|_| "send-demo".into()))
        .lease(env_ms("SEND_LEASE_MS", 30000))
        .timeout(env_ms("SEND_TIMEOUT_MS", 10000))
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(200))
        .on_attempt(|a, answer| {
            let status = answer.status.map_or_else(|| "none".to_owned(), |s| s.to_string());
            println!("attempt {} {} {status}", a.operation, a.attempt);
        })
        .on_finished(|a, result| {
            let (state, status) = describe(result);
            println!("finished {} {state} {status}", a.operation);
        })
        .build()?;
    match options.command {
        Command::Inline { count, prefix } => {
            prepare_orders(&pool, &target, count, &prefix, Some(&sender)).await?
        }
        Command::Work { until_idle, .. } => {
            let mut term = signal(SignalKind::terminate())?;
            let shutdown = async move {
                term.recv().await;
            };
            sender.run(Some(&target), until_idle, shutdown).await?;
        }
        Command::Prepare { .. } => unreachable!("answered above"),
    }
    Ok(())
}
