-- wrk script for the direct side of bench/http_tool.py: the same service request the HTTP
-- tool makes (GET /api/echo/<fresh value> with a gateway-signed token), sent straight to it.
--   wrk ... -s service_direct.lua URL -- TOKEN PREFIX
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  token = args[1]
  prefix = args[2]
  headers = {["Authorization"] = "Bearer " .. token, ["Accept"] = "application/json"}
end

function request()
  counter = counter + 1
  return wrk.format("GET", string.format("/api/echo/%s-%d-%d", prefix, tid, counter), headers)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d errors=%d p50_us=%d p99_us=%d non2xx=%d\n",
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), summary.errors.status))
end
