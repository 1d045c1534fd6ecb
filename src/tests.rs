//! In-process tests of the SPI paths (`cargo pgrx test`): each runs inside a backend with the
//! extension created, in a transaction that is rolled back afterwards.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> T {
        Spi::get_one::<T>(sql).expect("query failed").expect("query returned NULL")
    }

    fn outcome(sql_args: &str) -> String {
        one(&format!("SELECT outcome FROM idempotency.idem_claim({sql_args})"))
    }

    #[pg_test]
    fn claim_then_in_progress_then_replay() {
        assert_eq!(outcome("'acct', 'k1', 'fp'"), "claimed");
        assert_eq!(outcome("'acct', 'k1', 'fp'"), "in_progress");
        Spi::run(
            "SELECT idempotency.idem_complete('acct', 'k1', token, 201, '{\"id\": 7}')
             FROM idempotency.keys WHERE scope = 'acct' AND key = 'k1'",
        )
        .unwrap();
        assert_eq!(outcome("'acct', 'k1', 'fp'"), "replay");
        let body: String = one("SELECT (idempotency.idem_claim('acct', 'k1', 'fp')).response_body::text");
        assert_eq!(body, "{\"id\": 7}");
        let http: i32 = one("SELECT (idempotency.idem_claim('acct', 'k1', 'fp')).http_status");
        assert_eq!(http, 201);
    }

    #[pg_test]
    fn mismatch_wins_over_in_progress_and_replay() {
        assert_eq!(outcome("'acct', 'k2', 'fp-a'"), "claimed");
        assert_eq!(outcome("'acct', 'k2', 'fp-b'"), "mismatch");
        assert_eq!(outcome("'acct', 'k2', NULL"), "mismatch");
        let http: i32 = one("SELECT (idempotency.idem_claim('acct', 'k2', 'fp-b')).http_status");
        assert_eq!(http, 422);
    }

    #[pg_test]
    fn scopes_never_collide() {
        assert_eq!(outcome("'tenant-a', 'same-key'"), "claimed");
        assert_eq!(outcome("'tenant-b', 'same-key'"), "claimed");
    }

    #[pg_test]
    fn expired_record_counts_as_absent() {
        Spi::run(
            "INSERT INTO idempotency.keys (scope, key, status, token, locked_until, created_at, updated_at, expires_at)
             VALUES ('acct', 'old', 'in_progress', gen_random_uuid(), now() - interval '1 hour',
                     now() - interval '2 days', now() - interval '2 days', now() - interval '1 day')",
        )
        .unwrap();
        let found: i64 = one("SELECT count(*) FROM idempotency.idem_lookup('acct', 'old')");
        assert_eq!(found, 0);
        assert_eq!(outcome("'acct', 'old'"), "claimed");
        let attempts: i32 = one("SELECT attempts FROM idempotency.keys WHERE key = 'old'");
        assert_eq!(attempts, 1);
    }

    #[pg_test]
    fn ended_lease_is_taken_over_and_old_token_is_fenced() {
        Spi::run(
            "INSERT INTO idempotency.keys (scope, key, status, token, locked_until, recovery_point,
                                           recovery_data, created_at, updated_at, expires_at)
             VALUES ('acct', 'stale', 'in_progress', '00000000-0000-4000-8000-000000000001',
                     now() - interval '1 second', 'charged', '{\"charge\": \"ch_1\"}',
                     now(), now(), now() + interval '1 day')",
        )
        .unwrap();
        let (outcome, attempts, point): (Option<String>, Option<i32>, Option<String>) = Spi::get_three(
            "SELECT outcome, attempts, recovery_point FROM idempotency.idem_claim('acct', 'stale')",
        )
        .unwrap();
        assert_eq!(outcome.as_deref(), Some("reclaimed"));
        assert_eq!(attempts, Some(2));
        assert_eq!(point.as_deref(), Some("charged"));
        let released: bool =
            one("SELECT idempotency.idem_release('acct', 'stale', '00000000-0000-4000-8000-000000000001')");
        assert!(!released, "the old token must not release a claim it lost");
    }

    #[pg_test(error = "token does not own the idempotency record for scope \"acct\", key \"fenced\"")]
    fn old_token_cannot_complete() {
        assert_eq!(outcome("'acct', 'fenced'"), "claimed");
        Spi::run("SELECT idempotency.idem_complete('acct', 'fenced', gen_random_uuid(), 200)").unwrap();
    }

    #[pg_test]
    fn answers_from_a_read_take_no_transaction_id() {
        // The test transaction has written nothing yet, so it has no xid.
        Spi::connect(|client| {
            let xid = |c: &pgrx::spi::SpiClient<'_>| {
                c.select("SELECT txid_current_if_assigned()", None, &[])
                    .unwrap()
                    .first()
                    .get_one::<i64>()
                    .unwrap()
            };
            assert_eq!(xid(client), None);
            let answer = client
                .select("SELECT count(*) FROM idempotency.idem_lookup('nobody', 'nothing')", None, &[])
                .unwrap()
                .first()
                .get_one::<i64>()
                .unwrap();
            assert_eq!(answer, Some(0));
            assert_eq!(xid(client), None);
        });
    }

    #[pg_test]
    fn seen_is_true_once() {
        let first: bool = one("SELECT idempotency.idem_seen('queue', 'msg-1')");
        let again: bool = one("SELECT idempotency.idem_seen('queue', 'msg-1')");
        let other_scope: bool = one("SELECT idempotency.idem_seen('other', 'msg-1')");
        assert!(first && !again && other_scope);
    }

    #[pg_test]
    fn sweep_deletes_only_expired() {
        Spi::run(
            "INSERT INTO idempotency.keys (scope, key, status, token, response_status, created_at, updated_at, expires_at)
             SELECT 'acct', 'gone-' || i, 'completed', gen_random_uuid(), 200, now(), now(), now() - interval '1 minute'
             FROM generate_series(1, 5) i",
        )
        .unwrap();
        assert_eq!(outcome("'acct', 'live'"), "claimed");
        let swept: i64 = one("SELECT idempotency.idem_sweep(3)");
        assert_eq!(swept, 3);
        let swept: i64 = one("SELECT idempotency.idem_sweep()");
        assert_eq!(swept, 2);
        let left: i64 = one("SELECT count(*) FROM idempotency.keys WHERE scope = 'acct'");
        assert_eq!(left, 1);
    }

    #[pg_test]
    fn fingerprint_is_canonical() {
        let a: String = one("SELECT idempotency.idem_fingerprint('{\"b\":1,\"a\":2}'::jsonb)");
        let b: String = one("SELECT idempotency.idem_fingerprint('{ \"a\": 2, \"b\": 1.0 }'::jsonb)");
        let expected: String = one("SELECT 'sha256:' || encode(sha256('{\"a\":2,\"b\":1}'::bytea), 'hex')");
        assert_eq!(a, b);
        assert_eq!(a, expected);
    }

    /// idem_fingerprint walks the jsonb's binary form; it must give exactly what the
    /// canonicalizer gives for the jsonb's text, on thousands of generated documents with
    /// the hard parts (key order by UTF-16, escapes, every kind of number, deep nesting).
    #[pg_test]
    fn jsonb_walk_matches_the_text_canonicalizer() {
        use crate::jcs::fingerprint_json;
        use crate::jsonb::Jsonb;
        use crate::test_json::{random_members, Json, Style};
        use pgrx::FromDatum;
        let mut rng = crate::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        for i in 0..3000 {
            // Every other document an object, so that `ignore` has keys to find.
            let value =
                if i % 2 == 0 { Json::Obj(random_members(&mut rng, 4)) } else { Json::random(&mut rng, 5) };
            // jsonb refuses \u0000 in strings: a U+0001 stands in for it.
            let text = Style::compact().write(&value).replace("\\u0000", "\\u0001");
            let cstring = std::ffi::CString::new(text.clone()).unwrap();
            // SAFETY: jsonb_in takes a C string and returns a jsonb datum (or raises).
            let jsonb = unsafe {
                let datum = pgrx::direct_function_call::<pg_sys::Datum>(
                    pg_sys::jsonb_in,
                    &[Some(pg_sys::Datum::from(cstring.as_ptr()))],
                )
                .unwrap();
                Jsonb::from_datum(datum, false).unwrap()
            };
            let ignore: &[&str] = if i % 3 == 0 { &["a", "\u{e9}"] } else { &[] };
            assert_eq!(
                jsonb.fingerprint(ignore),
                fingerprint_json(&jsonb.to_text(), ignore),
                "document {text}"
            );
        }
    }

    #[pg_test(error = "argument \"key\" must not be null")]
    fn null_key_is_refused() {
        outcome("'acct', NULL");
    }
}
