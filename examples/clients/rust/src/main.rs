//! The idempotency extension from Rust (tokio-postgres).
//!
//!     DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres cargo run
//!
//! Runs, and checks, one claim / business write / complete / replay / mismatch cycle and a
//! message consumer's idem_seen. The database needs `CREATE EXTENSION idempotency`. The last
//! line is "rust: N passed, M failed".

use serde_json::{json, Value};
use tokio_postgres::{Client, Error, NoTls};
use uuid::Uuid;

const SCOPE: &str = "acct_42:POST /orders";

/// The usual way: claim, business write and stored response in one transaction.
/// Returns (outcome, http status, response body).
async fn create_order(
    db: &mut Client,
    key: &str,
    body: &Value,
) -> Result<(String, Option<i32>, Option<Value>), Error> {
    let tx = db.transaction().await?;
    let c = tx
        .query_one(
            "SELECT outcome, token, http_status, response_body
               FROM idempotency.idem_claim($1, $2, idempotency.idem_fingerprint($3::jsonb))",
            &[&SCOPE, &key, body],
        )
        .await?;
    let (outcome, token): (String, Option<Uuid>) = (c.get(0), c.get(1));
    let (Some(token), "claimed" | "reclaimed") = (token, outcome.as_str()) else {
        tx.rollback().await?; // replay: stored 201 + body; in_progress: 409; mismatch: 422
        return Ok((outcome, c.get(2), c.get(3)));
    };
    let order_id: i64 = tx
        .query_one(
            "INSERT INTO example_orders (item, qty) VALUES ($1, $2) RETURNING id",
            &[
                &body["item"].as_str(),
                &(body["qty"].as_i64().unwrap_or(0) as i32),
            ],
        )
        .await?
        .get(0);
    let response = json!({"order_id": order_id, "item": body["item"], "qty": body["qty"]});
    let headers = json!({"Location": format!("/orders/{order_id}")});
    tx.execute(
        "SELECT idempotency.idem_complete($1, $2, $3, 201, $4, $5)",
        &[&SCOPE, &key, &token, &response, &headers],
    )
    .await?;
    tx.commit().await?;
    Ok((outcome, Some(201), Some(response)))
}

/// An at-least-once consumer: the de-duplication and the work commit together.
async fn consume(db: &mut Client, message_id: &str, body: &Value) -> Result<bool, Error> {
    let tx = db.transaction().await?;
    let first: bool = tx
        .query_one(
            "SELECT idempotency.idem_seen('orders-consumer', $1)",
            &[&message_id],
        )
        .await?
        .get(0);
    if first {
        tx.execute(
            "INSERT INTO example_orders (item, qty) VALUES ($1, $2)",
            &[
                &body["item"].as_str(),
                &(body["qty"].as_i64().unwrap_or(0) as i32),
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(first)
}

struct Tally(u32, u32);

impl Tally {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Debug) {
        if ok {
            self.0 += 1;
            println!("ok   {name}");
        } else {
            self.1 += 1;
            println!("FAIL {name}: {detail:?}");
        }
    }
}

async fn run(t: &mut Tally) -> Result<(), Error> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        eprintln!("set DATABASE_URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres");
        std::process::exit(2)
    });
    let (mut db, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text, qty int)",
    )
    .await?;
    // Made once per business operation, outside any retry loop (a UUID v4 in real code).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let key = format!("rust-{}-{nanos}", std::process::id());
    let body = json!({"item": "book", "qty": 2});

    let first = create_order(&mut db, &key, &body).await?;
    t.check(
        "claim: claimed, the order is written, 201",
        first.0 == "claimed" && first.1 == Some(201),
        &first,
    );

    let again = create_order(&mut db, &key, &body).await?;
    t.check(
        "same key again: replay of the stored 201 and body",
        again.0 == "replay" && again.1 == Some(201) && again.2 == first.2,
        &again,
    );

    let other = create_order(&mut db, &key, &json!({"item": "book", "qty": 3})).await?;
    t.check(
        "same key, another body: mismatch, 422",
        other.0 == "mismatch" && other.1 == Some(422),
        &other,
    );

    let order_id = first
        .2
        .as_ref()
        .and_then(|b| b["order_id"].as_i64())
        .unwrap_or(-1);
    let n: i64 = db
        .query_one(
            "SELECT count(*) FROM example_orders WHERE id = $1",
            &[&order_id],
        )
        .await?
        .get(0);
    t.check("one order written", n == 1, n);

    let message_id = format!("msg-{key}");
    t.check(
        "idem_seen, first delivery: true",
        consume(&mut db, &message_id, &body).await?,
        (),
    );
    t.check(
        "idem_seen, redelivery: false",
        !consume(&mut db, &message_id, &body).await?,
        (),
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut t = Tally(0, 0);
    if let Err(e) = run(&mut t).await {
        t.check("the example ran to the end", false, e);
    }
    println!("rust: {} passed, {} failed", t.0, t.1);
    std::process::exit(if t.1 == 0 { 0 } else { 1 });
}
