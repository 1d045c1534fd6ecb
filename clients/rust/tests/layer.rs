//! The layer's settings, on a small axum app served in-process over real HTTP against the real
//! extension: ignored fields, the replayed-header allow-list, text bodies, stored 5xx, axum's
//! extractor rejections leaving the key free, and 503 when the database cannot be reached.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use common::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pg_idempotency::{Idem, IdempotencyLayer, OnServerError};

fn pool() -> Pool {
    let pg: tokio_postgres::Config = database_url().parse().unwrap();
    let manager = Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager).max_size(4).build().unwrap()
}

async fn serve(app: Router) -> u16 {
    let port = next_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn ignored_fields_allow_listed_headers_and_text_bodies() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = move |_: Idem| {
        let counter = counter.clone();
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            (
                StatusCode::OK,
                [("x-custom", "v1"), ("set-cookie", "a=b"), ("content-type", "text/plain; charset=utf-8")],
                format!("run {n}\n"),
            )
                .into_response()
        }
    };
    let layer = IdempotencyLayer::new(pool())
        .ignore_fields(&["request_id"])
        .replay_headers(&[header::CONTENT_TYPE, HeaderName::from_static("x-custom")]);
    let port = serve(Router::new().route("/things", routing::post(handler).layer(layer))).await;
    let tenant = unique("acct_layer");
    let key = unique("k");
    let first = post(port, "/things", &tenant, Some(&key), r#"{"a": 1, "request_id": "r1"}"#, &[]).await;
    assert_eq!((first.status, first.body.as_slice()), (200, &b"run 1\n"[..]), "{first:?}");
    let again = post(port, "/things", &tenant, Some(&key), r#"{"request_id": "r2", "a": 1}"#, &[]).await;
    assert!(again.replayed(), "an ignored field differs: still a replay: {again:?}");
    assert_eq!(again.body, first.body, "a text body is replayed as the text");
    assert_eq!(again.header("x-custom"), Some("v1"));
    assert_eq!(again.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(again.header("set-cookie"), None, "not allow-listed");
    let other = post(port, "/things", &tenant, Some(&key), r#"{"a": 2, "request_id": "r1"}"#, &[]).await;
    assert!(other.is_problem(422), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_stored_when_configured() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = move |_: Idem| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            (StatusCode::SERVICE_UNAVAILABLE, [("content-type", "application/json")], r#"{"down": true}"#)
                .into_response()
        }
    };
    let layer = IdempotencyLayer::new(pool())
        .committed_first(std::time::Duration::from_secs(5))
        .on_server_error(OnServerError::Store);
    let port = serve(Router::new().route("/stored", routing::post(handler).layer(layer))).await;
    let tenant = unique("acct_5xx");
    let key = unique("k");
    let first = post(port, "/stored", &tenant, Some(&key), "{}", &[]).await;
    let again = post(port, "/stored", &tenant, Some(&key), "{}", &[]).await;
    assert_eq!((first.status, again.status), (503, 503));
    assert!(!first.replayed() && again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the stored 503 is replayed, the handler ran once");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_extractor_without_the_layer_is_a_500() {
    async fn handler(_: Idem) -> Response {
        "unreachable".into_response()
    }
    let port = serve(Router::new().route("/bare", routing::post(handler))).await;
    let r = post(port, "/bare", "t", Some("k"), "{}", &[]).await;
    assert!(r.is_problem(500), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_completion_after_a_takeover_is_fenced_and_not_a_success() {
    // A handler that stops renewing and stalls past its lease when asked to.
    async fn handler(idem: Idem, headers: axum::http::HeaderMap) -> Response {
        if headers.contains_key("x-stall") {
            idem.stop_renewal();
            tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
        }
        let who = if headers.contains_key("x-stall") { "stalled" } else { "takeover" };
        (StatusCode::CREATED, [("content-type", "application/json")], format!("{{\"by\": \"{who}\"}}"))
            .into_response()
    }
    let layer = IdempotencyLayer::new(pool()).committed_first(std::time::Duration::from_millis(300));
    let port = serve(Router::new().route("/fenced", routing::post(handler).layer(layer))).await;
    let tenant = unique("acct_fence");
    let key = unique("k");
    let (t, k) = (tenant.clone(), key.clone());
    let stalled =
        tokio::spawn(async move { post(port, "/fenced", &t, Some(&k), "{}", &[("x-stall", "1")]).await });
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // its lease of 300 ms ended
    let takeover = post(port, "/fenced", &tenant, Some(&key), "{}", &[]).await;
    assert_eq!((takeover.status, takeover.json()["by"].as_str()), (201, Some("takeover")), "{takeover:?}");
    let late = stalled.await.unwrap();
    assert!(late.is_problem(409), "the late completion is not reported as success: {late:?}");
    let again = post(port, "/fenced", &tenant, Some(&key), "{}", &[]).await;
    assert!(again.replayed() && again.body == takeover.body, "{again:?}");
}

#[derive(serde::Deserialize)]
struct Order {
    item: String,
    quantity: u32,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_axum_json_rejects_leaves_the_key_free_in_both_modes() {
    async fn handler(_: Idem, axum::Json(order): axum::Json<Order>) -> Response {
        let body = format!("{{\"item\": \"{}\", \"quantity\": {}}}", order.item, order.quantity);
        (StatusCode::CREATED, [("content-type", "application/json")], body).into_response()
    }
    let layer = IdempotencyLayer::new(pool());
    let app =
        Router::new().route("/same", routing::post(handler).layer(layer.clone().same_transaction())).route(
            "/first",
            routing::post(handler).layer(layer.committed_first(std::time::Duration::from_secs(5))),
        );
    let port = serve(app).await;
    let db = db().await;
    for path in ["/same", "/first"] {
        let tenant = unique("acct_reject");
        let key = unique("k");
        let missing = post(port, path, &tenant, Some(&key), r#"{"item": "tea"}"#, &[]).await;
        assert_eq!(missing.status, 422, "axum's Json rejection of a body missing a field: {missing:?}");
        let broken = post(port, path, &tenant, Some(&key), r#"{"item": "#, &[]).await;
        assert_eq!(broken.status, 400, "axum's Json rejection of a body that does not parse: {broken:?}");
        assert_eq!(records(&db, &tenant).await, 0, "{path}: no record is left for the refused bodies");
        let good = post(port, path, &tenant, Some(&key), r#"{"item": "tea", "quantity": 2}"#, &[]).await;
        assert_eq!((good.status, good.replayed()), (201, false), "{path}: the corrected body runs: {good:?}");
        let again = post(port, path, &tenant, Some(&key), r#"{"item": "tea", "quantity": 2}"#, &[]).await;
        assert!(again.replayed() && again.body == good.body, "{path}: then it replays: {again:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_database_is_a_503_with_retry_after_in_both_modes() {
    // A port nobody listens on: every connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port_nobody_listens = closed.local_addr().unwrap().port();
    drop(closed);
    let pg: tokio_postgres::Config =
        format!("postgresql://postgres@127.0.0.1:{port_nobody_listens}/postgres").parse().unwrap();
    let manager = Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let down = Pool::builder(manager).max_size(2).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = move |_: Idem| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED.into_response()
        }
    };
    let layer = IdempotencyLayer::new(down);
    let app = Router::new()
        .route("/same", routing::post(handler.clone()).layer(layer.clone().same_transaction()))
        .route(
            "/first",
            routing::post(handler).layer(layer.committed_first(std::time::Duration::from_secs(5))),
        );
    let port = serve(app).await;
    for path in ["/same", "/first", "/same"] {
        let r = post(port, path, "acct_down", Some(&unique("k")), "{}", &[]).await;
        let retry_after: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(r.is_problem(503) && retry_after >= 1, "{path}: {r:?}");
        assert_eq!(r.json()["type"], "urn:pg-idempotency:problem:service-unavailable");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_never_answers_is_a_503_within_the_layers_own_bound() {
    // A server that accepts connections and never says a word (a hung host): deadpool, whose
    // pool here has no timeouts (its default), would wait for it forever.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = silent.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let pg: tokio_postgres::Config =
        format!("postgresql://postgres@127.0.0.1:{silent_port}/postgres").parse().unwrap();
    let manager = Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let hung = Pool::builder(manager).max_size(2).build().unwrap();
    async fn handler(_: Idem) -> Response {
        StatusCode::CREATED.into_response()
    }
    let layer = IdempotencyLayer::new(hung);
    let app = Router::new()
        .route("/same", routing::post(handler).layer(layer.clone()))
        .route(
            "/quick",
            routing::post(handler).layer(layer.clone().connection_timeout(Duration::from_millis(300))),
        )
        .route("/first", routing::post(handler).layer(layer.committed_first(Duration::from_secs(5))));
    let port = serve(app).await;
    for (path, bound) in [
        ("/same", Duration::from_secs(2)),
        ("/first", Duration::from_secs(2)),
        ("/quick", Duration::from_millis(800)),
    ] {
        let started = std::time::Instant::now();
        let r = post(port, path, "acct_hung", Some(&unique("k")), "{}", &[]).await;
        let took = started.elapsed();
        assert!(r.is_problem(503) && r.header("retry-after") == Some("1"), "{path}: {r:?}");
        assert!(took < bound, "{path}: answered in {took:?}, not within {bound:?}");
    }
    assert!(!held.lock().unwrap().is_empty(), "the pool did try the silent server");
}
