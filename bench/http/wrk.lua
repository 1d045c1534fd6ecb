-- bench/http.sh's wrk script: POST /charges with a JSON body and an Idempotency-Key.
--   wrk ... -s bench/http/wrk.lua URL -- fresh PREFIX       a new key per request
--   wrk ... -s bench/http/wrk.lua URL -- replay PREFIX N    keys PREFIX-0 .. PREFIX-(N-1), made beforehand
-- The plain endpoint gets the same requests as the protected one (it ignores the key).
-- done() prints one line: RESULT, requests, duration (us), non-2xx/3xx answers, socket errors,
-- p50 and p99 latency (us).
local threads = 0

function setup(thread)
    thread:set("thread_id", threads)
    threads = threads + 1
end

local mode, prefix, keys
local sent = 0

function init(args)
    mode, prefix, keys = args[1], args[2], tonumber(args[3] or "0")
    if mode ~= "fresh" and not (mode == "replay" and keys and keys > 0) then
        error("usage: -- fresh PREFIX | -- replay PREFIX N")
    end
    wrk.method = "POST"
    wrk.body = '{"amount": 1250, "currency": "eur"}'
    wrk.headers["Content-Type"] = "application/json"
end

function request()
    sent = sent + 1
    local key
    if mode == "fresh" then
        key = prefix .. "-" .. thread_id .. "-" .. sent
    else
        key = prefix .. "-" .. (sent % keys)
    end
    wrk.headers["Idempotency-Key"] = '"' .. key .. '"'
    return wrk.format()
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("RESULT\t%d\t%d\t%d\t%d\t%d\t%d\n", summary.requests, summary.duration,
        e.status, e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99)))
end
