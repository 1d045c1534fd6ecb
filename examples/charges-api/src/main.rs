//! charges-api: an example HTTP service that makes `POST /charges` idempotent with the
//! `idempotency` PostgreSQL extension, following draft-ietf-httpapi-idempotency-key-header-07.
//!
//! ```text
//! charges-api [--database-url URL] [--listen ADDR] [--gateway-url URL] [--lease-ms N]
//!             [--pool-size N] [--gateway-timeout-ms N] [--allow-fault-injection]
//! charges-api gateway-stub [--listen ADDR] [--delay-ms N]
//! ```
//!
//! Every option can also come from the environment: DATABASE_URL, LISTEN_ADDR, GATEWAY_URL,
//! LEASE_MS, POOL_SIZE, GATEWAY_TIMEOUT_MS, ALLOW_FAULT_INJECTION=1 (the options win).
//!
//! Routes: `POST /charges` (claim in the business transaction), `POST /charges/external`
//! (claim committed first, then the gateway), `GET /charges/{id}`, `GET /healthz`. Both POSTs
//! take `X-Api-Key` (the tenant), `Idempotency-Key` and `{"amount": 500, "currency": "eur"}`.
//! With `--allow-fault-injection` (tests only), a request header
//! `X-Fault-Pause-After-Gateway-Ms: N` makes the committed-first handler stall N ms after the
//! gateway answered, without renewing its lease: a worker that hangs past its lease.

mod api;
mod gateway;
mod idem_key;
mod pool;

use std::process::exit;
use std::time::Duration;

struct Options {
    database_url: String,
    listen: String,
    gateway_url: String,
    lease_ms: u64,
    pool_size: usize,
    gateway_timeout_ms: u64,
    allow_fault_injection: bool,
    delay_ms: u64,
}

fn usage(message: &str) -> ! {
    eprintln!("charges-api: {message}");
    eprintln!(
        "usage: charges-api [--database-url URL] [--listen ADDR] [--gateway-url URL] [--lease-ms N]\n\
         \x20                  [--pool-size N] [--gateway-timeout-ms N] [--allow-fault-injection]\n\
         \x20      charges-api gateway-stub [--listen ADDR] [--delay-ms N]"
    );
    exit(2)
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{name}: not a number: {value:?}")))
}

fn parse_options(args: &[String], stub: bool) -> Options {
    let mut o = Options {
        database_url: env_or(
            "DATABASE_URL",
            "postgresql://postgres@127.0.0.1:5432/postgres",
        ),
        listen: env_or(
            "LISTEN_ADDR",
            if stub {
                "127.0.0.1:8081"
            } else {
                "127.0.0.1:8080"
            },
        ),
        gateway_url: env_or("GATEWAY_URL", "http://127.0.0.1:8081"),
        lease_ms: number("LEASE_MS", &env_or("LEASE_MS", "10000")),
        pool_size: number("POOL_SIZE", &env_or("POOL_SIZE", "16")),
        gateway_timeout_ms: number("GATEWAY_TIMEOUT_MS", &env_or("GATEWAY_TIMEOUT_MS", "30000")),
        allow_fault_injection: env_or("ALLOW_FAULT_INJECTION", "0") == "1",
        delay_ms: 0,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match (flag, stub) {
            ("--listen", _) => o.listen = value(),
            ("--delay-ms", true) => o.delay_ms = number(flag, &value()),
            ("--database-url", false) => o.database_url = value(),
            ("--gateway-url", false) => o.gateway_url = value(),
            ("--lease-ms", false) => o.lease_ms = number(flag, &value()),
            ("--pool-size", false) => o.pool_size = number(flag, &value()),
            ("--gateway-timeout-ms", false) => o.gateway_timeout_ms = number(flag, &value()),
            ("--allow-fault-injection", false) => o.allow_fault_injection = true,
            ("-h" | "--help", _) => usage("help"),
            _ => usage(&format!("unknown argument {arg:?}")),
        }
    }
    if o.lease_ms < 100 {
        usage("--lease-ms must be at least 100");
    }
    if o.pool_size == 0 {
        usage("--pool-size must be positive");
    }
    o
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("gateway-stub") {
        let o = parse_options(&args[1..], true);
        if let Err(e) = gateway::run_stub(&o.listen, o.delay_ms).await {
            eprintln!("gateway-stub: {e}");
            exit(1);
        }
        return;
    }
    let o = parse_options(&args, false);
    let db_config: tokio_postgres::Config = o
        .database_url
        .parse()
        .unwrap_or_else(|e| usage(&format!("--database-url: {e}")));
    let gateway =
        gateway::Gateway::new(&o.gateway_url, Duration::from_millis(o.gateway_timeout_ms))
            .unwrap_or_else(|e| usage(&e));
    let app = api::App::new(
        pool::Pool::new(db_config, o.pool_size),
        gateway,
        Duration::from_millis(o.lease_ms),
        o.allow_fault_injection,
    );
    if let Err(e) = app.prepare_schema().await {
        eprintln!("charges-api: {e}");
        exit(1);
    }
    let listener = tokio::net::TcpListener::bind(&o.listen)
        .await
        .unwrap_or_else(|e| {
            eprintln!("charges-api: cannot listen on {}: {e}", o.listen);
            exit(1)
        });
    eprintln!(
        "charges-api listening on {}",
        listener.local_addr().unwrap()
    );
    if let Err(e) = axum::serve(listener, app.router()).await {
        eprintln!("charges-api: {e}");
        exit(1);
    }
}
