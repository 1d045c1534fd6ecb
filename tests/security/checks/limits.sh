# Sourced by run.sh. Hostile and huge input end to end (tests/regress/sql/11_limits.sql has
# the plain regression cases). Every case runs in a session of its own and passes only if
# its answer is the expected one, the session's backend is the same one afterwards
# (pg_backend_pid), and the server log gained no crash line.

section "limits: hostile and huge input"
DB=sec_limits
newdb $DB
sql postgres $DB -c "CREATE TABLE public.limits_deep (d int PRIMARY KEY, j jsonb)"

# lcase NAME EXPECTED <<'SQL'  setup statements, a line "--probe", then one probe statement.
# The case's answer is the probe's output, or "ERROR <SQLSTATE>" when the probe failed.
lcase() {
    local name=$1 expected=$2 script setup probe out value st same crashes_before crashes_after
    script=$(cat)
    setup=$(printf '%s\n' "$script" | sed '/^--probe$/,$d')
    probe=$(printf '%s\n' "$script" | sed '0,/^--probe$/d')
    crashes_before=$(crash_lines "$MAIN/server.log")
    out=$({
        echo 'SELECT pg_catalog.pg_backend_pid() AS __pid0 \gset'
        echo '\o /dev/null'
        printf '%s\n' "$setup"
        printf '%s\n' '\o'
        printf '%s\n' '\echo __begin'
        printf '%s\n' "$probe"
        printf '%s\n' '\echo __state :SQLSTATE'
        echo 'SELECT pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) :__pid0 AS __same \gset'
        printf '%s\n' '\echo __same :__same'
    } | APP=sec-limits sql postgres $DB)
    value=$(printf '%s\n' "$out" | sed -n '/^__begin$/,/^__state /p' | sed '1d;$d')
    st=$(printf '%s\n' "$out" | sed -n 's/^__state //p')
    same=$(printf '%s\n' "$out" | sed -n 's/^__same //p')
    [ "$st" != 00000 ] && value="ERROR $st"
    crashes_after=$(crash_lines "$MAIN/server.log")
    check "$name" "$expected; same backend; no crash" \
        "$value; $([ "$same" = t ] && echo "same backend" || echo "backend LOST")$([ "$crashes_after" = "$crashes_before" ] && echo "; no crash" || echo "; CRASH in server log")"
}

# --- keys at the length limit -------------------------------------------------------------
lcase "key of exactly 255 characters: claimed, completed, replayed, stored whole" "replay/255" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', repeat('k', 255)) \gset
SELECT idempotency.idem_complete('lim', repeat('k', 255), :'tok', 200, '{"ok": true}');
--probe
SELECT c.outcome || '/' || length(l.key) FROM idempotency.idem_claim('lim', repeat('k', 255)) c, idempotency.idem_lookup('lim', repeat('k', 255)) l;
SQL
lcase "key of 256 characters: 22023" "ERROR 22023" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim('lim', repeat('k', 256));
SQL
lcase "255 x 'é' key (510 bytes) in a 255 x '😀' scope (1020 bytes): claimed, completed, replayed, stored whole" "replay/255/255/1020/510" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim(repeat('😀', 255), repeat('é', 255)) \gset
SELECT idempotency.idem_complete(repeat('😀', 255), repeat('é', 255), :'tok', 201, '{"ok": true}');
--probe
SELECT c.outcome || '/' || length(l.scope) || '/' || length(l.key) || '/' || octet_length(l.scope) || '/' || octet_length(l.key)
  FROM idempotency.idem_claim(repeat('😀', 255), repeat('é', 255)) c, idempotency.idem_lookup(repeat('😀', 255), repeat('é', 255)) l;
SQL
lcase "256 x 'é' key: 22023 (characters are counted, not bytes)" "ERROR 22023" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim('lim', repeat('é', 256));
SQL
lcase "256 x '😀' scope: 22023" "ERROR 22023" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim(repeat('😀', 256), 'k');
SQL
lcase "message id of 255 x '😀': recorded, then a duplicate" "true/false" <<'SQL'
--probe
SELECT idempotency.idem_seen('lim', repeat('😀', 255)) || '/' || idempotency.idem_seen('lim', repeat('😀', 255));
SQL
lcase "message id of 256 characters: 22023" "ERROR 22023" <<'SQL'
--probe
SELECT idempotency.idem_seen('lim', repeat('m', 256));
SQL
lcase "a C1 control (U+0085) in a key: 22023" "ERROR 22023" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim('lim', 'a' || chr(133) || 'b');
SQL
lcase "a format character (U+200B, not a control) in a key is accepted" "claimed" <<'SQL'
--probe
SELECT outcome FROM idempotency.idem_claim('lim', 'a' || chr(8203) || 'b');
SQL

# --- quotes, escapes, NUL ------------------------------------------------------------------
# portable: idem_lookup is a PL/pgSQL STABLE function, which reads with the statement's
# snapshot: in the statement of the claim that made the record it finds no row (so the
# probe returns none); the next statement finds it, verbatim (the case after this one).
lcase "quotes, backslashes, NUL-looking escapes and SQL in scope and key are stored verbatim$(by_edition "" " (portable: idem_lookup in the claim's own statement returns no row)")" \
    "$(by_edition "claimed/true/true/true" "")" <<'SQL'
\set s '''acct ''''42'''' "x" \\x00 \\u0000 \\0 %s %n $1 ;--'''
\set k '''''''); DROP TABLE idempotency.keys; --'''
--probe
SELECT c.outcome || '/' || (l.scope = :s) || '/' || (l.key = :k) || '/' || (to_regclass('idempotency.keys') IS NOT NULL)
  FROM idempotency.idem_claim(:s, :k) c, idempotency.idem_lookup(:s, :k) l;
SQL
if [ "$PORTABLE" = 1 ]; then
    lcase "portable: quotes, backslashes, NUL-looking escapes and SQL in scope and key are stored verbatim (looked up in the next statement)" "claimed/true/true/true" <<'SQL'
\set s '''acct2 ''''42'''' "x" \\x00 \\u0000 \\0 %s %n $1 ;--'''
\set k '''''''); DROP TABLE idempotency.keys; --'''
SELECT outcome AS claimed FROM idempotency.idem_claim(:s, :k) \gset
--probe
SELECT :'claimed' || '/' || (l.scope = :s) || '/' || (l.key = :k) || '/' || (to_regclass('idempotency.keys') IS NOT NULL)
  FROM idempotency.idem_lookup(:s, :k) l;
SQL
fi
lcase "a real NUL never reaches the extension: E'\\u0000' is refused by PostgreSQL's parser (42601)" "ERROR 42601" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim('lim', E'nul\u0000');
SQL
lcase "a real NUL never reaches the extension: chr(0) is refused by PostgreSQL (54000)" "ERROR 54000" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim('lim', chr(0));
SQL
lcase "a NUL byte through convert_from: refused by PostgreSQL (22021)" "ERROR 22021" <<'SQL'
--probe
SELECT * FROM idempotency.idem_claim(convert_from('\x6b00'::bytea, 'UTF8'), 'k');
SQL
lcase "a jsonb \\u0000 is refused by PostgreSQL's jsonb input (22P05)" "ERROR 22P05" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint('{"a": "\u0000"}'::jsonb);
SQL

# --- response size -------------------------------------------------------------------------
lcase "a 10 MB body beyond idempotency.max_response_size (default 1MB): 54000" "ERROR 54000" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-10mb') \gset
--probe
SELECT idempotency.idem_complete('lim', 'k-10mb', :'tok', 200, to_jsonb(repeat('x', 10 * 1024 * 1024)));
SQL
lcase "after the refused 10 MB body nothing was stored: still in_progress" "in_progress//" <<'SQL'
--probe
SELECT status || '/' || coalesce(response_status::text, '') || '/' || coalesce(response_body::text, '') FROM idempotency.idem_lookup('lim', 'k-10mb');
SQL
lcase "a 10 MB body within max_response_size = 16MB: stored and replayed whole" "replay/200/10485760" <<'SQL'
SET idempotency.max_response_size = '16MB';
SELECT token AS tok FROM idempotency.keys WHERE key = 'k-10mb' \gset
SELECT idempotency.idem_complete('lim', 'k-10mb', :'tok', 200, to_jsonb(repeat('x', 10 * 1024 * 1024)));
RESET idempotency.max_response_size;
--probe
SELECT outcome || '/' || http_status || '/' || length(response_body #>> '{}') FROM idempotency.idem_claim('lim', 'k-10mb');
SQL
lcase "a body of exactly max_response_size (1048576 bytes): stored" "stored 1048576" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-edge') \gset
SELECT 1048576 - pg_column_size(to_jsonb(''::text)) AS n \gset
--probe
SELECT 'stored ' || pg_column_size(v.b) FROM (SELECT to_jsonb(repeat('x', :n)) AS b) v,
       LATERAL (SELECT idempotency.idem_complete('lim', 'k-edge', :'tok', 200, v.b)) s;
SQL
lcase "a body one byte over max_response_size: 54000" "ERROR 54000" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-edge2') \gset
SELECT 1048576 - pg_column_size(to_jsonb(''::text)) + 1 AS n \gset
--probe
SELECT idempotency.idem_complete('lim', 'k-edge2', :'tok', 200, to_jsonb(repeat('x', :n)));
SQL
lcase "headers count toward the limit (body 100 bytes under it, headers 200 bytes): 54000" "ERROR 54000" <<'SQL'
SELECT token AS tok FROM idempotency.keys WHERE key = 'k-edge2' \gset
SELECT 1048576 - pg_column_size(to_jsonb(''::text)) - 100 AS n \gset
--probe
SELECT idempotency.idem_complete('lim', 'k-edge2', :'tok', 200, to_jsonb(repeat('x', :n)), jsonb_build_object('X-Pad', repeat('p', 200)));
SQL
lcase "10 MB of checkpoint data at the default limit: 54000" "ERROR 54000" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-ckpt', NULL, NULL, '1 millisecond') \gset
--probe
SELECT idempotency.idem_checkpoint('lim', 'k-ckpt', :'tok', 'step', to_jsonb(repeat('y', 10 * 1024 * 1024)), '1 millisecond');
SQL
lcase "10 MB of checkpoint data within 16MB: stored, and handed to the next owner on takeover" "reclaimed/2/step/10485760" <<'SQL'
SET idempotency.max_response_size = '16MB';
SELECT token AS tok FROM idempotency.keys WHERE key = 'k-ckpt' \gset
SELECT idempotency.idem_checkpoint('lim', 'k-ckpt', :'tok', 'step', to_jsonb(repeat('y', 10 * 1024 * 1024)), '1 millisecond');
SELECT pg_sleep(0.05);
--probe
SELECT outcome || '/' || attempts || '/' || recovery_point || '/' || length(recovery_data #>> '{}') FROM idempotency.idem_claim('lim', 'k-ckpt');
SQL

# --- nesting ---------------------------------------------------------------------------------
lcase "1000 levels of nesting: fingerprinted" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint((repeat('[', 1000) || repeat(']', 1000))::jsonb)
       = 'sha256:' || encode(sha256(convert_to(repeat('[', 1000) || repeat(']', 1000), 'UTF8')), 'hex');
SQL
lcase "1001 levels of nesting: fingerprint refused with 22023" "ERROR 22023" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint((repeat('{"a":', 1001) || '1' || repeat('}', 1001))::jsonb);
SQL
lcase "a 1001-level body is stored and replayed as it is (storing does not canonicalize)" "replay/true" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-1001') \gset
SELECT idempotency.idem_complete('lim', 'k-1001', :'tok', 200, (repeat('[', 1001) || repeat(']', 1001))::jsonb);
--probe
SELECT outcome || '/' || (response_body = (repeat('[', 1001) || repeat(']', 1001))::jsonb) FROM idempotency.idem_claim('lim', 'k-1001');
SQL
# portable: the fingerprint renders the document with one recursive query; 999 levels around
# 10 MB take longer than the 20 s (57014), where the native edition is well within it.
lcase "999 levels around a 10 MB string: $(by_edition "fingerprinted (linear work) within" "portable: NOT fingerprinted within") a 20 s statement_timeout" \
    "$(by_edition t "ERROR 57014")" <<'SQL'
SET statement_timeout = '20s';
--probe
SELECT idempotency.idem_fingerprint((repeat('[', 999) || '"' || repeat('x', 10 * 1024 * 1024) || '"' || repeat(']', 999))::jsonb)
       = 'sha256:' || encode(sha256(convert_to(repeat('[', 999) || '"' || repeat('x', 10 * 1024 * 1024) || '"' || repeat(']', 999), 'UTF8')), 'hex');
SQL

# deepest STACK: the deepest array PostgreSQL's jsonb input accepts (binary search), stored
# in limits_deep; prints the depth, or nothing when SET max_stack_depth = STACK is refused.
deepest() {
    local stack=$1 lo=1000 hi=400000 mid
    [ "$(state postgres $DB "SET max_stack_depth = '$stack';")" = 00000 ] || return 0
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if [ "$(state postgres $DB "SET max_stack_depth = '$stack'; INSERT INTO limits_deep VALUES ($mid, (repeat('[', $mid) || repeat(']', $mid))::jsonb);")" = 00000 ]; then
            lo=$mid
        else
            hi=$mid
        fi
    done
    echo "$lo"
}
deep_cases() { # deep_cases STACK DEPTH
    local stack=$1 d=$2
    lcase "deepest jsonb PostgreSQL accepts at max_stack_depth $stack ($d levels): fingerprint refused with 22023" "ERROR 22023" <<SQL
SET max_stack_depth = '$stack';
--probe
SELECT idempotency.idem_fingerprint(j) FROM limits_deep WHERE d = $d;
SQL
    lcase "... stored as body and checkpoint data, replayed and looked up intact" "replay/true/true/step" <<SQL
SET max_stack_depth = '$stack';
SELECT token AS tok FROM idempotency.idem_claim('lim', 'deep-$d') \\gset
SELECT idempotency.idem_checkpoint('lim', 'deep-$d', :'tok', 'step', j) FROM limits_deep WHERE d = $d;
SELECT idempotency.idem_complete('lim', 'deep-$d', :'tok', 200, j) FROM limits_deep WHERE d = $d;
--probe
SELECT c.outcome || '/' || (md5(c.response_body::text) = md5(x.j::text)) || '/' || (md5(l.recovery_data::text) = md5(x.j::text)) || '/' || l.recovery_point
  FROM idempotency.idem_claim('lim', 'deep-$d') c, idempotency.idem_lookup('lim', 'deep-$d') l, limits_deep x WHERE x.d = $d;
SQL
    lcase "... as response_headers: refused with 22023 (not an object)" "ERROR 22023" <<SQL
SET max_stack_depth = '$stack';
SELECT token AS tok FROM idempotency.idem_claim('lim', 'deep-h-$d') \\gset
--probe
SELECT idempotency.idem_complete('lim', 'deep-h-$d', :'tok', 200, NULL, j) FROM limits_deep WHERE d = $d;
SQL
    lcase "... one level deeper: refused by PostgreSQL itself (54001 stack depth), the backend lives" "ERROR 54001" <<SQL
SET max_stack_depth = '$stack';
--probe
SELECT idempotency.idem_fingerprint((repeat('[', $((d + 1))) || repeat(']', $((d + 1))))::jsonb);
SQL
}
d=$(deepest 2MB)
if [ -n "$d" ]; then deep_cases 2MB "$d"; else fail "finding the deepest jsonb at max_stack_depth 2MB"; fi
d=$(deepest 6MB)
if [ -n "$d" ]; then deep_cases 6MB "$d"; else skip "deepest jsonb at max_stack_depth 6MB" "the server's stack limit does not allow it"; fi

# --- wide and numeric ------------------------------------------------------------------------
lcase "a jsonb object of 100k keys: fingerprint equals sha256 of its canonical text built in SQL" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint(jsonb_object_agg('k' || lpad(i::text, 6, '0'), i))
       = 'sha256:' || encode(sha256(convert_to('{' || string_agg('"k' || lpad(i::text, 6, '0') || '":' || i, ',' ORDER BY i) || '}', 'UTF8')), 'hex')
  FROM generate_series(0, 99999) AS i;
SQL
lcase "a 100k-key body: over the default limit (54000)" "ERROR 54000" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-wide') \gset
--probe
SELECT idempotency.idem_complete('lim', 'k-wide', :'tok', 200, jsonb_object_agg('k' || i, i)) FROM generate_series(0, 99999) AS i;
SQL
lcase "a 100k-key body and 100k-key headers within 16MB: stored and replayed equal" "replay/true/true" <<'SQL'
SET idempotency.max_response_size = '16MB';
SELECT token AS tok FROM idempotency.keys WHERE key = 'k-wide' \gset
SELECT idempotency.idem_complete('lim', 'k-wide', :'tok', 200, jsonb_object_agg('k' || i, i), jsonb_object_agg('h' || i, i::text)) FROM generate_series(0, 99999) AS i;
--probe
SELECT c.outcome || '/' || (c.response_body = (SELECT jsonb_object_agg('k' || i, i) FROM generate_series(0, 99999) AS i))
       || '/' || (c.response_headers = (SELECT jsonb_object_agg('h' || i, i::text) FROM generate_series(0, 99999) AS i))
  FROM idempotency.idem_claim('lim', 'k-wide') c;
SQL
lcase "an array of 1M numbers: fingerprint equals sha256 of its canonical text" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint(to_jsonb(array_agg(i)))
       = 'sha256:' || encode(sha256(convert_to('[' || string_agg(i::text, ',' ORDER BY i) || ']', 'UTF8')), 'hex')
  FROM generate_series(1, 1000000) AS i;
SQL
lcase "1e308, -0, 1e-400 fingerprint as RFC 8785's [1e+308,0,0]" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint('[1e308, -0, 1e-400]'::jsonb) = 'sha256:' || encode(sha256('[1e+308,0,0]'), 'hex');
SQL
lcase "ECMAScript number forms: 0.1, 1e21, 1e-7, 30 digits, 5e-324, 1e-324, -0.0, 100" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint('[0.1, 1e21, 1e-7, 123456789012345678901234567890, 5e-324, 1e-324, -0.0, 100]'::jsonb)
       = 'sha256:' || encode(sha256('[0.1,1e+21,1e-7,1.2345678901234568e+29,5e-324,0,0,100]'), 'hex');
SQL
lcase "1e309 (beyond a double): fingerprint refused with 22023" "ERROR 22023" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint('{"amount": 1e309}'::jsonb);
SQL
lcase "-1e1000 (a numeric far beyond a double): fingerprint refused with 22023" "ERROR 22023" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint(('[-1' || repeat('0', 1000) || ']')::jsonb);
SQL
lcase "a body of 1e308, -0, 1e-400, 1e309 is stored and replayed exactly (numerics are not doubles there)" "replay/true" <<'SQL'
SELECT token AS tok FROM idempotency.idem_claim('lim', 'k-num') \gset
SELECT idempotency.idem_complete('lim', 'k-num', :'tok', 200, '[1e308, -0, 1e-400, 1e309]'::jsonb);
--probe
SELECT outcome || '/' || (response_body = '[1e308, -0, 1e-400, 1e309]'::jsonb) FROM idempotency.idem_claim('lim', 'k-num');
SQL

# --- bytes and big arguments -------------------------------------------------------------------
lcase "invalid UTF-8, surrogates, overlong forms, NUL, empty in a bytea fingerprint: plain sha256 of the bytes" "true/6" <<'SQL'
--probe
SELECT bool_and(idempotency.idem_fingerprint(b) = 'sha256:' || encode(sha256(b), 'hex')) || '/' || count(*)
  FROM (VALUES ('\xc328ffa0a1'::bytea), ('\xeda080'), ('\xc0af'), ('\x00'), ('\xf4908080'), (''::bytea)) AS v(b);
SQL
lcase "a 10 MB fingerprint argument: stored; the same answers in_progress, one changed byte mismatch" "in_progress/mismatch" <<'SQL'
SELECT outcome FROM idempotency.idem_claim('lim', 'k-bigfp', repeat('f', 10 * 1024 * 1024));
--probe
SELECT a.outcome || '/' || b.outcome
  FROM idempotency.idem_claim('lim', 'k-bigfp', repeat('f', 10 * 1024 * 1024)) a,
       idempotency.idem_claim('lim', 'k-bigfp', repeat('f', 10 * 1024 * 1024 - 1) || 'g') b;
SQL
lcase "an ignore list of 100k names with NULLs in it" "t" <<'SQL'
--probe
SELECT idempotency.idem_fingerprint('{"a": 1, "b": 2, "k7": 3}'::jsonb, array_append(array_agg('k' || i), NULL) || ARRAY[NULL, 'a'])
       = idempotency.idem_fingerprint('{"b": 2}'::jsonb)
  FROM generate_series(1, 100000) AS i;
SQL

check "limits: no backend crash, PANIC or internal error in the server log" 0 "$(crash_lines "$MAIN/server.log")"
