-- wrk script: one MCP tools/call per request (protocol 2026-07-28, no session), fresh
-- arguments each time, spread over the runs given as script arguments (named in _meta).
--   wrk ... -s mcp_tool_calls.lua URL -- TOKEN PREFIX RUN_ID [RUN_ID ...]
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "common.lua")
local counter = 0

function init(args)
  token = args[1]
  runs = {}
  for i = 3, #args do table.insert(runs, args[i]) end
  headers = {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = "2026-07-28",
    ["Mcp-Method"] = "tools/call",
    ["Mcp-Name"] = "add",
  }
end

function request()
  counter = counter + 1
  local run = runs[(counter + tid) % #runs + 1]
  local body = string.format(
    '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"add","arguments":{"a":%d,"b":%d},'
    .. '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    .. '"io.modelcontextprotocol/clientCapabilities":{},"gateway/run_id":"%s"}}}',
    counter, counter, tid * 100 + 1, run)
  return wrk.format("POST", "/mcp", headers, body)
end
