-- idem_fingerprint: 'sha256:' || hex of the payload. For jsonb the hashed bytes are the
-- RFC 8785 canonical JSON of the payload, so any client with an RFC 8785 library can
-- compute the same value; for bytea they are the bytes as they are.

-- The format: 'sha256:' and 64 lower-case hex digits. The empty object hashes "{}".
SELECT idempotency.idem_fingerprint('{}'::jsonb);
SELECT idempotency.idem_fingerprint('{}'::jsonb) = fixture.sha('{}') AS is_sha256_of_text;

-- RFC 8785, section 3.2.2: the example object, whose canonical text is given in the RFC.
SELECT idempotency.idem_fingerprint($${
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}$$::jsonb)
 = fixture.sha($${"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}$$)
 AS rfc8785_example;

-- RFC 8785, section 3.2.3: keys are sorted by their UTF-16 code units.
SELECT idempotency.idem_fingerprint($${
  "\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}$$::jsonb)
 = fixture.sha(E'{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",'
                 '"\u20ac":"Euro Sign","\U0001F600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}')
 AS rfc8785_sorting;

-- Numbers are written as ECMAScript prints them: 1.0 is 1, 1e2 is 100, 2.50 is 2.5,
-- -0 is 0, 1e21 is 1e+21, 0.000001 stays as it is and 0.0000001 is 1e-7.
SELECT input, idempotency.idem_fingerprint(input::jsonb) = fixture.sha(canonical) AS agrees
  FROM (VALUES ('[1, 1.0, 1e2, 2.50]', '[1,1,100,2.5]'),
               ('[-0, 0.0, -1.50]', '[0,0,-1.5]'),
               ('[1e21, 1e20, 123456789012345678901]', '[1e+21,100000000000000000000,123456789012345680000]'),
               ('[0.000001, 0.0000001, 1.5e-10]', '[0.000001,1e-7,1.5e-10]'),
               ('[9007199254740993]', '[9007199254740992]')) AS t(input, canonical);
SELECT idempotency.idem_fingerprint('{"amount": 1}'::jsonb)
     = idempotency.idem_fingerprint('{"amount": 1.00}'::jsonb) AS one_equals_one_point_zero;

-- Key order and white space do not matter; the contract's own example agrees.
SELECT idempotency.idem_fingerprint('{"b":1,"a":2}'::jsonb)
     = idempotency.idem_fingerprint('{ "a": 2, "b": 1.0 }'::jsonb) AS same,
       idempotency.idem_fingerprint('{"b":1,"a":2}'::jsonb) = fixture.sha('{"a":2,"b":1}') AS canonical;
-- Nested objects are sorted too; array order is kept, so it does matter.
SELECT idempotency.idem_fingerprint('{"z": {"y": [3, {"b": 1, "a": 2}], "x": null}, "a": []}'::jsonb)
     = fixture.sha('{"a":[],"z":{"x":null,"y":[3,{"a":2,"b":1}]}}') AS nested,
       idempotency.idem_fingerprint('[1, 2]'::jsonb) = idempotency.idem_fingerprint('[2, 1]'::jsonb) AS arrays_reordered_agree;
-- Different values give different fingerprints, also across types.
SELECT idempotency.idem_fingerprint('{"amount": 500}'::jsonb) = idempotency.idem_fingerprint('{"amount": 501}'::jsonb) AS same_for_500_and_501,
       idempotency.idem_fingerprint('{"amount": 500}'::jsonb) = idempotency.idem_fingerprint('{"amount": "500"}'::jsonb) AS same_for_number_and_string;

-- Escaping: quote, backslash and the short escapes; other control characters below U+0020
-- as \u00XX in lower-case hex; "/", DEL and non-ASCII text as they are (the expected text
-- is an E'' string: \\ is one backslash of JSON, \uXXXX a character).
SELECT idempotency.idem_fingerprint($$["q\"b\\s/", "\b\f\n\r\t", "\u0001\u001f\u007f", "\u00e9\u65e5\u672c\ud83d\ude00"]$$::jsonb)
     = fixture.sha(E'["q\\"b\\\\s/","\\b\\f\\n\\r\\t","\\u0001\\u001f\u007f","\u00e9\u65e5\u672c\U0001F600"]') AS escaping;
-- Non-ASCII text is hashed as UTF-8, whichever way the input spelled it.
SELECT idempotency.idem_fingerprint('{"name": "Zoë Ångström"}'::jsonb)
     = idempotency.idem_fingerprint('{"name": "Zo\u00eb \u00c5ngstr\u00f6m"}'::jsonb) AS same_text,
       idempotency.idem_fingerprint('{"name": "Zoë Ångström"}'::jsonb)
     = fixture.sha('{"name":"Zoë Ångström"}') AS utf8;

-- ignore leaves out top-level keys only (here a client-generated request id and a
-- timestamp); a nested key of the same name stays, and unknown names change nothing.
SELECT idempotency.idem_fingerprint('{"amount": 500, "request_id": "r-1", "sent_at": "10:00"}'::jsonb,
                                    ARRAY['request_id', 'sent_at'])
     = idempotency.idem_fingerprint('{"amount": 500, "request_id": "r-2", "sent_at": "10:05"}'::jsonb,
                                    ARRAY['request_id', 'sent_at']) AS retries_agree,
       idempotency.idem_fingerprint('{"amount": 500, "request_id": "r-1"}'::jsonb, ARRAY['request_id'])
     = fixture.sha('{"amount":500}') AS top_level_dropped;
SELECT idempotency.idem_fingerprint('{"meta": {"request_id": "r-1"}, "request_id": "r-1"}'::jsonb, ARRAY['request_id'])
     = fixture.sha('{"meta":{"request_id":"r-1"}}') AS nested_kept,
       idempotency.idem_fingerprint('{"a": 1}'::jsonb, ARRAY['nope', NULL])
     = idempotency.idem_fingerprint('{"a": 1}'::jsonb) AS unknown_and_null_names_ignored,
       idempotency.idem_fingerprint('[{"request_id": 1}]'::jsonb, ARRAY['request_id'])
     = fixture.sha('[{"request_id":1}]') AS array_payload_untouched;

-- A NULL payload gives NULL (a claim with a NULL fingerprint), for both overloads.
SELECT idempotency.idem_fingerprint(NULL::jsonb) IS NULL AS jsonb_null,
       idempotency.idem_fingerprint(NULL::bytea) IS NULL AS bytea_null;

-- The bytea overload hashes the bytes as they are: no canonical form, so white space counts.
SELECT idempotency.idem_fingerprint('\x'::bytea);
SELECT idempotency.idem_fingerprint(convert_to('{"b":1,"a":2}', 'UTF8'))
     = 'sha256:' || encode(sha256(convert_to('{"b":1,"a":2}', 'UTF8')), 'hex') AS is_sha256_of_bytes,
       idempotency.idem_fingerprint(convert_to('{"b":1,"a":2}', 'UTF8'))
     = idempotency.idem_fingerprint(convert_to('{"b": 1, "a": 2}', 'UTF8')) AS same_with_spaces;

-- An untyped literal matches both overloads: say which one is meant.
SELECT * FROM fixture.try($$ SELECT idempotency.idem_fingerprint('{}') $$);

-- jsonb holds numbers that no double can: RFC 8785 cannot write them, so they are refused
-- with 22023 (a tiny one rounds to 0, as in any JSON parser).
SELECT * FROM fixture.try($$ SELECT idempotency.idem_fingerprint('{"amount": 1e309}'::jsonb) $$);
SELECT * FROM fixture.try($$ SELECT idempotency.idem_fingerprint('[-1e400]'::jsonb) $$);
SELECT idempotency.idem_fingerprint('[1e-400]'::jsonb) = fixture.sha('[0]') AS tiny_is_zero,
       idempotency.idem_fingerprint('[1.7976931348623157e308]'::jsonb) = fixture.sha('[1.7976931348623157e+308]') AS largest_double;

-- Nesting is limited to 1000 levels; deeper JSON is refused with 22023.
SELECT idempotency.idem_fingerprint((repeat('[', 1000) || repeat(']', 1000))::jsonb)
     = fixture.sha(repeat('[', 1000) || repeat(']', 1000)) AS depth_1000;
SELECT * FROM fixture.try($$ SELECT idempotency.idem_fingerprint((repeat('[', 1001) || repeat(']', 1001))::jsonb) $$);

-- A fingerprint is what idem_claim compares: the same request, spelled differently by a
-- retry, is recognised; a different request with the same key is a mismatch.
SELECT outcome FROM idempotency.idem_claim('fp', 'k1', idempotency.idem_fingerprint('{"to": "acct_9", "amount": 5.0}'::jsonb));
SELECT outcome FROM idempotency.idem_claim('fp', 'k1', idempotency.idem_fingerprint('{"amount": 5, "to": "acct_9"}'::jsonb));
SELECT outcome FROM idempotency.idem_claim('fp', 'k1', idempotency.idem_fingerprint('{"amount": 6, "to": "acct_9"}'::jsonb));
