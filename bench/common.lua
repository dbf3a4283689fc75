-- What the wrk scripts of bench/ share: a number for each thread (`tid`, set in the
-- thread's state before its init), and the RESULT line bench/common.py reads when done.
-- A script in this folder loads it first, wherever wrk is started from:
--   dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "common.lua")
local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d errors=%d p50_us=%d p99_us=%d non2xx=%d\n",
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), summary.errors.status))
end
