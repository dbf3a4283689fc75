-- wrk script: every request carries fresh tool_call ids and fresh arguments, and the
-- requests are spread over the runs given as script arguments.
--   wrk ... -s tool_calls.lua URL -- TOKEN PREFIX BATCH RUN_ID [RUN_ID ...]
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "common.lua")
local counter = 0

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
