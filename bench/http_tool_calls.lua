-- wrk script for the gateway side of bench/http_tool.py: one HTTP tool call per request,
-- with a fresh tool_call id and a fresh argument every time, spread over the given runs.
--   wrk ... -s http_tool_calls.lua URL -- TOKEN PREFIX RUN_ID [RUN_ID ...]
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "common.lua")
local counter = 0

function init(args)
  token = args[1]
  prefix = args[2]
  runs = {}
  for i = 3, #args do table.insert(runs, args[i]) end
  headers = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
end

function request()
  counter = counter + 1
  local run = runs[(counter + tid) % #runs + 1]
  local id = string.format("%s-%d-%d", prefix, tid, counter)
  local body = string.format(
    '{"tool_calls":[{"id":"%s","type":"function","function":{"name":"lookup","arguments":"{\\"value\\":\\"%s\\"}"}}]}',
    id, id)
  return wrk.format("POST", "/v1/runs/" .. run .. "/tool-calls", headers, body)
end
