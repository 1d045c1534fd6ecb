-- RFC 8785's own examples and edge numbers: prints a line for each case that is wrong,
-- nothing when all are right. Numbers: RFC 8785 Appendix B (as the native edition's unit
-- tests take them) and the brief's edge numbers; objects: RFC 8785 section 3.2.3's example
-- and its sorting example (3.2.3), hashed as a client hashes the canonical text.
SELECT format('number %s: expected %s, got %s', input, expected, idempotency.portable_json_number(input::numeric))
  FROM (VALUES ('0', '0'), ('-0', '0'), ('5e-324', '5e-324'), ('-5e-324', '-5e-324'),
               ('1.7976931348623157e308', '1.7976931348623157e+308'), ('-1.7976931348623157e308', '-1.7976931348623157e+308'),
               ('9007199254740992', '9007199254740992'), ('-9007199254740992', '-9007199254740992'),
               ('295147905179352830000', '295147905179352830000'), ('9.999999999999997e22', '9.999999999999997e+22'),
               ('1e23', '1e+23'), ('1.0000000000000001e23', '1.0000000000000001e+23'),
               ('999999999999999700000', '999999999999999700000'), ('999999999999999900000', '999999999999999900000'),
               ('1e21', '1e+21'), ('9.999999999999997e-7', '9.999999999999997e-7'), ('0.000001', '0.000001'),
               ('333333333.3333332', '333333333.3333332'), ('333333333.33333325', '333333333.33333325'),
               ('333333333.3333333', '333333333.3333333'), ('333333333.3333334', '333333333.3333334'),
               ('333333333.33333343', '333333333.33333343'), ('-0.0000033333333333333333', '-0.0000033333333333333333'),
               ('1424953923781206.25', '1424953923781206.2'),
               ('1', '1'), ('1.0', '1'), ('1e2', '100'), ('2.50', '2.5'), ('-0.0', '0'), ('0e10', '0'),
               ('1e20', '100000000000000000000'), ('1e-7', '1e-7'), ('-1.5e-7', '-1.5e-7'),
               ('123456789012345678901234', '1.2345678901234569e+23'), ('123456789012345680000', '123456789012345680000'),
               ('9007199254740993', '9007199254740992'), ('0.1', '0.1'), ('-1e-400', '0'), ('-12.5', '-12.5'),
               ('1059438285926254.25', '1059438285926254.2'), ('26363981746409.3125', '26363981746409.312'),
               ('7.120236347223045e-307', '7.120236347223045e-307'), ('1000000', '1000000'),
               ('69691839856870576', '69691839856870580'), ('2.4703282292062328e-324', '5e-324'),
               ('2.4703282292062327e-324', '0'), ('1.7976931348623158e308', '1.7976931348623157e+308'))
       AS t(input, expected)
 WHERE idempotency.portable_json_number(input::numeric) IS DISTINCT FROM expected;
SELECT format('out of range %s: got %s', input, idempotency.portable_json_number(input::numeric))
  FROM (VALUES ('1e400'), ('-1e309'), ('1.7976931348623159e308')) AS t(input)
 WHERE idempotency.portable_json_number(input::numeric) IS NOT NULL;
SELECT format('example %s', name)
  FROM (VALUES
    ('3.2.3', $j${"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                 "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}$j$,
     $c${"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}$c$),
    ('sorting', $j${"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
                   "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
                   "\u00f6": "Latin Small Letter O With Diaeresis"}$j$,
     E'{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign","\U0001F600":"Emoji: Grinning Face","\uFB33":"Hebrew Letter Dalet With Dagesh"}'),
    ('utf16 order', $j${"\ue000": 1, "\ud800\udc00": 2}$j$, E'{"\U00010000":2,"\uE000":1}'),
    ('ignore', $j${"b": 1, "a": 2, "ts": 3}$j$, '{"a":2,"b":1}'))
  AS t(name, input, canonical)
 WHERE idempotency.idem_fingerprint(input::jsonb, CASE WHEN name = 'ignore' THEN '{ts,NULL}'::text[] END)
       IS DISTINCT FROM 'sha256:' || encode(sha256(convert_to(canonical, 'UTF8')), 'hex');
-- Too deep, and beyond the double range: 22023 naming the payload.
DO $$
DECLARE
    code text;
    msg text;
BEGIN
    BEGIN
        PERFORM idempotency.idem_fingerprint((repeat('[', 1001) || repeat(']', 1001))::jsonb);
        RAISE NOTICE 'depth 1001: no error';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        IF code <> '22023' OR msg <> 'invalid argument "payload": json nested deeper than 1000 levels' THEN
            RAISE NOTICE 'depth 1001: % %', code, msg;
        END IF;
    END;
    BEGIN
        PERFORM idempotency.idem_fingerprint('{"a": [1e400]}'::jsonb);
        RAISE NOTICE '1e400: no error';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        IF code <> '22023' OR msg <> 'invalid argument "payload": number out of range for RFC 8785: 1000000000000000000000000000000000000000...' THEN
            RAISE NOTICE '1e400: % %', code, msg;
        END IF;
    END;
END $$;
