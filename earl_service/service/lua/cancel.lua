-- Cancel job ARGV[1]: a queued job at once (and out of the queue), a running one is flagged for its
-- worker; a finished job is left as it is. Returns the job's JSON, or nil when it does not exist.
local jobs, queue = KEYS[1], KEYS[2]
local id, now = ARGV[1], tonumber(ARGV[2])
local raw = redis.call('HGET', jobs, id)
if not raw then return nil end
local doc = cjson.decode(raw)
if doc.state == 'queued' then
  doc.state = 'cancelled'; doc.finished = now; doc.cancel_requested = true
  redis.call('LREM', queue, 0, id)
elseif doc.state == 'running' then
  doc.cancel_requested = true
else
  return raw
end
local text = cjson.encode(doc)
redis.call('HSET', jobs, id, text)
return text
