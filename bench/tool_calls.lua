-- wrk script: every request carries fresh tool_call ids and fresh arguments, and the
-- requests are spread over the runs given as script arguments.
--   wrk ... -s tool_calls.lua URL -- TOKEN PREFIX BATCH RUN_ID [RUN_ID ...]
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  token = args[1]
  prefix = args[2]
  batch = tonumber(args[3])
  runs = {}
  for i = 4, #args do table.insert(runs, args[i]) end
  headers = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
end

function request()
  counter = counter + 1
  local run = runs[(counter + tid) % #runs + 1]
  local calls = {}
  for i = 1, batch do
    local id = string.format("%s-%d-%d-%d", prefix, tid, counter, i)
    calls[i] = string.format(
      '{"id":"%s","type":"function","function":{"name":"add","arguments":"{\\"a\\":%d,\\"b\\":%d}"}}',
      id, counter, tid * 100 + i)
  end
  local body = '{"tool_calls":[' .. table.concat(calls, ",") .. ']}'
  return wrk.format("POST", "/v1/runs/" .. run .. "/tool-calls", headers, body)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d errors=%d p50_us=%d p99_us=%d non2xx=%d\n",
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), summary.errors.status))
end
