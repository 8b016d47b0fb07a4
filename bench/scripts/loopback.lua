-- wrk script for bench/scripts/loopback.sh: POSTs the JSON body in
-- $BODY_FILE with an Idempotency-Key that is new on every request
-- (KEY_MODE=fresh) or the one key $FIXED_KEY (KEY_MODE=replay).
local body = assert(io.open(os.getenv("BODY_FILE"), "rb")):read("*a")
local mode = os.getenv("KEY_MODE") or "fresh"
local fixed = os.getenv("FIXED_KEY") or "loopback-replay"
local run = os.getenv("RUN_ID") or tostring(os.time())
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local n = 0
local headers = { ["Content-Type"] = "application/json" }

function request()
  if mode == "replay" then
    headers["Idempotency-Key"] = fixed
  else
    n = n + 1
    headers["Idempotency-Key"] = string.format("fr-%s-%d-%d", run, tid or 0, n)
  end
  return wrk.format("POST", nil, headers, body)
end
