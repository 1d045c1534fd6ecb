//! Responses the middleware makes (RFC 9457 problems) and the stored form of a handler's
//! response (status, allow-listed headers, body) that `idem_complete` keeps and a replay sends.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};

/// The header a replayed response carries.
pub const REPLAYED: &str = "idempotent-replayed";

/// The problem types' common prefix (contract/contract.json, "problem_type_prefix").
pub const PROBLEM_TYPE_PREFIX: &str = "urn:pg-idempotency:problem:";

/// One of the middleware's own answers, exactly as contract/contract.json gives it
/// (`src/contract_tests.rs` checks [`PROBLEMS`] against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Problem {
    pub slug: &'static str,
    pub status: u16,
    pub title: &'static str,
    pub detail: &'static str,
    /// Sent with `Retry-After`.
    pub retry_after: bool,
}

pub const KEY_MISSING: Problem = Problem {
    slug: "idempotency-key-missing",
    status: 400,
    title: "Idempotency-Key missing",
    detail: "This request requires an Idempotency-Key header.",
    retry_after: false,
};
pub const KEY_INVALID: Problem = Problem {
    slug: "idempotency-key-invalid",
    status: 400,
    title: "Idempotency-Key invalid",
    detail: "The Idempotency-Key header must appear once and hold 1 to 255 characters, none of them control characters.",
    retry_after: false,
};
pub const IN_PROGRESS: Problem = Problem {
    slug: "idempotency-key-in-progress",
    status: 409,
    title: "Request in progress",
    detail: "A request with this Idempotency-Key is still being processed. Retry later.",
    retry_after: true,
};
pub const SUPERSEDED: Problem = Problem {
    slug: "idempotency-key-superseded",
    status: 409,
    title: "Request taken over",
    detail: "This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.",
    retry_after: true,
};
pub const REUSED: Problem = Problem {
    slug: "idempotency-key-reused",
    status: 422,
    title: "Idempotency-Key reused",
    detail:
        "This Idempotency-Key was used with a different request payload. Use a new key for a new request.",
    retry_after: false,
};
pub const EXPIRED: Problem = Problem {
    slug: "idempotency-key-expired",
    status: 410,
    title: "Idempotency-Key expired",
    detail: "This Idempotency-Key was used and its stored response has expired. Use a new key.",
    retry_after: false,
};
pub const SERVICE_UNAVAILABLE: Problem = Problem {
    slug: "service-unavailable",
    status: 503,
    title: "Service unavailable",
    detail: "The database could not be reached; nothing was done. Retry later.",
    retry_after: true,
};
pub const INTERNAL_ERROR: Problem = Problem {
    slug: "internal-error",
    status: 500,
    title: "Internal server error",
    detail: "The request failed.",
    retry_after: false,
};
pub const PROBLEMS: [Problem; 8] =
    [KEY_MISSING, KEY_INVALID, IN_PROGRESS, SUPERSEDED, REUSED, EXPIRED, SERVICE_UNAVAILABLE, INTERNAL_ERROR];

impl Problem {
    /// The answer; `Retry-After` (whole seconds, at least 1) where the problem has one.
    pub fn response(&self, retry_after_secs: u64) -> Response {
        let mut r = problem_with_type(
            self.status,
            &format!("{PROBLEM_TYPE_PREFIX}{}", self.slug),
            self.title,
            self.detail,
        );
        if self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs.max(1)));
        }
        r
    }
}

/// An RFC 9457 problem with `type` `urn:pg-idempotency:problem:<slug>`: that namespace is the
/// contract's, so give only a slug of [`PROBLEMS`]; an application's own answers are [`app_problem`].
pub fn problem(status: u16, slug: &str, title: &str, detail: &str) -> Response {
    problem_with_type(status, &format!("{PROBLEM_TYPE_PREFIX}{slug}"), title, detail)
}

/// An application's own RFC 9457 problem (a 401, a validation error): `type` is `about:blank`,
/// as in the Python and Node packages.
pub fn app_problem(status: u16, title: &str, detail: &str) -> Response {
    problem_with_type(status, "about:blank", title, detail)
}

fn problem_with_type(status: u16, problem_type: &str, title: &str, detail: &str) -> Response {
    let body = json!({
        "type": problem_type,
        "title": title,
        "status": status,
        "detail": detail,
    });
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/problem+json")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

/// The contract's 409 `in_progress` answer, with `Retry-After` in whole seconds, at least 1.
pub fn in_progress(retry_after_secs: u64) -> Response {
    IN_PROGRESS.response(retry_after_secs)
}

/// Whether a Content-Type names JSON (`application/json`, `application/problem+json`, ...).
pub fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A response as `idem_complete` stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub status: u16,
    /// A JSON object: allow-listed header name -> value.
    pub headers: Value,
    /// JSON bodies as JSON; other UTF-8 bodies as a JSON string; an empty body as None.
    pub body: Option<Value>,
}

/// What could not be stored (the body is neither JSON nor UTF-8 text).
#[derive(Debug)]
pub struct NotStorable(pub &'static str);

/// The stored form of a handler's response.
pub fn to_stored(
    status: StatusCode,
    headers: &HeaderMap,
    body: &Bytes,
    allow: &[HeaderName],
) -> Result<Stored, NotStorable> {
    let mut kept = Map::new();
    for name in allow {
        if let Some(v) = headers.get(name) {
            let v = v.to_str().map_err(|_| NotStorable("a header value is not ASCII"))?;
            kept.insert(display_name(name), Value::String(v.to_owned()));
        }
    }
    let body = if body.is_empty() {
        None
    } else if is_json(headers.get(header::CONTENT_TYPE)) {
        Some(serde_json::from_slice(body).map_err(|_| NotStorable("the JSON body does not parse"))?)
    } else {
        let text = std::str::from_utf8(body).map_err(|_| NotStorable("the body is not UTF-8"))?;
        Some(Value::String(text.to_owned()))
    };
    Ok(Stored { status: status.as_u16(), headers: Value::Object(kept), body })
}

/// `location` -> `Location`, `content-type` -> `Content-Type` (stored for people reading rows).
fn display_name(name: &HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The bytes to send for a stored body. `json_text` is the jsonb as PostgreSQL prints it
/// (the same for the first answer and every replay); text bodies are sent as the text.
pub fn body_bytes(headers: &Value, body: Option<&Value>, json_text: Option<&str>) -> Vec<u8> {
    let content_type = headers
        .as_object()
        .and_then(|m| m.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-type")))
        .and_then(|(_, v)| v.as_str())
        .and_then(|v| HeaderValue::from_str(v).ok());
    match body {
        None | Some(Value::Null) if json_text.is_none() => Vec::new(),
        Some(Value::String(s)) if !is_json(content_type.as_ref()) => s.clone().into_bytes(),
        _ => json_text.unwrap_or("").as_bytes().to_vec(),
    }
}

/// The response for a stored status, headers and body bytes.
pub fn from_stored(status: u16, headers: &Value, body: Vec<u8>, replayed: bool) -> Response {
    let mut r = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .body(Body::from(body))
        .expect("a valid response");
    if let Some(map) = headers.as_object() {
        for (name, value) in map {
            if let (Ok(n), Some(Ok(v))) =
                (HeaderName::from_bytes(name.as_bytes()), value.as_str().map(HeaderValue::from_str))
            {
                r.headers_mut().insert(n, v);
            }
        }
    }
    if replayed {
        r.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn keeps_only_allow_listed_headers_and_parses_json() {
        let allow = [header::LOCATION, header::CONTENT_TYPE];
        let h = headers(&[("location", "/x/1"), ("content-type", "application/json"), ("set-cookie", "a=b")]);
        let s =
            to_stored(StatusCode::CREATED, &h, &Bytes::from_static(b"{\"b\":1, \"a\":[2]}"), &allow).unwrap();
        assert_eq!(s.status, 201);
        assert_eq!(s.headers, json!({"Location": "/x/1", "Content-Type": "application/json"}));
        assert_eq!(s.body, Some(json!({"a": [2], "b": 1})));
    }

    #[test]
    fn text_bodies_are_strings_and_binary_is_refused() {
        let h = headers(&[("content-type", "text/plain")]);
        let s =
            to_stored(StatusCode::OK, &h, &Bytes::from_static(b"hello"), &[header::CONTENT_TYPE]).unwrap();
        assert_eq!(s.body, Some(json!("hello")));
        assert_eq!(body_bytes(&s.headers, s.body.as_ref(), Some("\"hello\"")), b"hello");
        assert!(to_stored(StatusCode::OK, &h, &Bytes::from_static(b"\xff\xfe"), &[]).is_err());
        let j = headers(&[("content-type", "application/json")]);
        assert!(to_stored(StatusCode::OK, &j, &Bytes::from_static(b"{nope"), &[]).is_err());
    }

    #[test]
    fn json_bodies_are_sent_as_postgres_prints_them() {
        let h = json!({"Content-Type": "application/problem+json"});
        assert_eq!(body_bytes(&h, Some(&json!("x")), Some("\"x\"")), b"\"x\"");
        assert_eq!(body_bytes(&h, Some(&json!({"a": 1})), Some("{\"a\": 1}")), b"{\"a\": 1}");
        assert_eq!(body_bytes(&json!({}), None, None), b"");
    }

    #[test]
    fn json_content_types() {
        for (ct, json) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("application/problem+json", true),
            ("text/plain", false),
            ("application/jsonx", false),
        ] {
            assert_eq!(is_json(Some(&HeaderValue::from_static(ct))), json, "{ct}");
        }
        assert!(!is_json(None));
    }

    #[test]
    fn replay_sets_stored_headers_and_the_marker() {
        let r = from_stored(201, &json!({"Location": "/a"}), b"{}".to_vec(), true);
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["location"], "/a");
        assert_eq!(r.headers()[REPLAYED], "true");
        assert_eq!(display_name(&header::CONTENT_TYPE), "Content-Type");
    }
}
