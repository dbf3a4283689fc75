-- wrk script for the direct side of bench/http_tool.py: the same service request the HTTP
-- tool makes (GET /api/echo/<fresh value> with a gateway-signed token), sent straight to it.
--   wrk ... -s service_direct.lua URL -- TOKEN PREFIX
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "") .. "common.lua")
local counter = 0

function init(args)
  token = args[1]
  prefix = args[2]
  headers = {["Authorization"] = "Bearer " .. token, ["Accept"] = "application/json"}
end

function request()
  counter = counter + 1
  return wrk.format("GET", string.format("/api/echo/%s-%d-%d", prefix, tid, counter), headers)
end
