//! The payment gateway: a client for it, and a stub of it to run locally and in tests.
//!
//! Like real payment APIs, the gateway takes an idempotency key of its own: a charge
//! retried with the same `Idempotency-Key` returns the first charge and charges nothing.
//! The service picks that key once per operation and checkpoints it before the call, so a
//! worker that takes a dead one's claim over repeats the call with the same key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------
// Client

pub struct Gateway {
    authority: String,
    base_path: String,
    timeout: Duration,
}

pub struct GatewayAnswer {
    pub status: u16,
    pub body: Value,
}

pub enum GatewayError {
    /// Nothing was sent: the gateway cannot have acted on the request.
    NotReached(String),
    /// The request may have been received and acted on; only a retry with the same
    /// gateway key can tell.
    Unknown(String),
}

impl Gateway {
    pub fn new(url: &str, timeout: Duration) -> Result<Gateway, String> {
        let uri: Uri = url.parse().map_err(|e| format!("gateway URL {url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("gateway URL {url:?}: only http:// is supported"));
        }
        let auth = uri.authority().ok_or_else(|| format!("gateway URL {url:?} has no host"))?;
        let authority = match auth.port_u16() {
            Some(_) => auth.to_string(),
            None => format!("{}:80", auth.host()),
        };
        Ok(Gateway { authority, base_path: uri.path().trim_end_matches('/').to_string(), timeout })
    }

    /// `POST {base}/v1/charges` with the gateway idempotency key.
    pub async fn charge(
        &self,
        gateway_key: &str,
        amount: i64,
        currency: &str,
    ) -> Result<GatewayAnswer, GatewayError> {
        let stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| GatewayError::NotReached("connect timed out".into()))?
            .map_err(|e| GatewayError::NotReached(format!("connect: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| GatewayError::NotReached(format!("handshake: {e}")))?;
        tokio::spawn(conn);
        let body = json!({ "amount": amount, "currency": currency }).to_string();
        let request = Request::post(format!("{}/v1/charges", self.base_path))
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", gateway_key)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| GatewayError::NotReached(format!("request: {e}")))?;
        // From here on the gateway may have acted on the request.
        let exchange = async {
            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            let body = serde_json::from_slice(&bytes).map_err(|e| format!("answer is not JSON: {e}"))?;
            Ok::<_, String>(GatewayAnswer { status, body })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(GatewayError::Unknown(e)),
            Err(_) => Err(GatewayError::Unknown("no answer in time".into())),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Stub: `charges-api gateway-stub --listen ADDR [--delay-ms N]`
//
//   POST /v1/charges   {"amount", "currency"} with Idempotency-Key: 201 {"id": "gw_N", ...};
//                      402 card_declined for an amount of 1000000 or more. The charge is
//                      made (and counted) when the request arrives, then the stub sleeps
//                      delay_ms before answering: a slow gateway.
//   GET  /_stats       {"delay_ms", "total_charges", "keys": {key: {"requests", "charges", "status", "response"}}}
//   POST /_config      {"delay_ms": N}

#[derive(Default)]
struct Stub {
    delay_ms: AtomicU64,
    next_id: AtomicU64,
    keys: Mutex<BTreeMap<String, Entry>>,
}

struct Entry {
    requests: u64,
    charges: u64,
    status: u16,
    response: Value,
}

fn json_response(status: u16, body: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn stub_charge(State(stub): State<Arc<Stub>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return json_response(400, &json!({"error": "Idempotency-Key required"}));
    };
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (Some(amount), Some(currency)) = (request["amount"].as_i64(), request["currency"].as_str()) else {
        return json_response(400, &json!({"error": "amount and currency required"}));
    };
    let (status, response) = {
        let mut keys = stub.keys.lock().unwrap();
        let entry = keys.entry(key).or_insert_with(|| {
            if amount >= 1_000_000 {
                Entry { requests: 0, charges: 0, status: 402, response: json!({"error": "card_declined"}) }
            } else {
                let n = stub.next_id.fetch_add(1, Ordering::SeqCst) + 1;
                let id = format!("gw_{n}");
                Entry {
                    requests: 0,
                    charges: 1,
                    status: 201,
                    response: json!({"id": id, "amount": amount, "currency": currency, "status": "succeeded"}),
                }
            }
        });
        entry.requests += 1;
        (entry.status, entry.response.clone())
    };
    let delay = stub.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    json_response(status, &response)
}

async fn stub_stats(State(stub): State<Arc<Stub>>) -> Response {
    let keys = stub.keys.lock().unwrap();
    let total: u64 = keys.values().map(|e| e.charges).sum();
    let map: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(k, e)| {
            let v = json!({"requests": e.requests, "charges": e.charges, "status": e.status, "response": e.response});
            (k.clone(), v)
        })
        .collect();
    json_response(
        200,
        &json!({"delay_ms": stub.delay_ms.load(Ordering::SeqCst), "total_charges": total, "keys": map}),
    )
}

async fn stub_config(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    let config: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match config["delay_ms"].as_u64() {
        Some(ms) => {
            stub.delay_ms.store(ms, Ordering::SeqCst);
            json_response(200, &json!({"delay_ms": ms}))
        }
        None => (StatusCode::BAD_REQUEST, "{\"error\": \"delay_ms required\"}").into_response(),
    }
}

pub async fn run_stub(listen: &str, delay_ms: u64) -> std::io::Result<()> {
    let stub = Arc::new(Stub::default());
    stub.delay_ms.store(delay_ms, Ordering::SeqCst);
    let app = Router::new()
        .route("/v1/charges", post(stub_charge))
        .route("/_stats", get(stub_stats))
        .route("/_config", post(stub_config))
        .with_state(stub);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("gateway-stub listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await
}
