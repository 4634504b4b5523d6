-- Apply the JSON patch ARGV[5] to job ARGV[1] while worker ARGV[2] owns it (state running), in one step.
-- ARGV[4] says what else happens: 'beat' (refresh the heartbeat), 'finish' (leave the running set)
-- or 'release' (back to the front of the queue). Returns the job's JSON, or nil when not owned.
local jobs, queue, running = KEYS[1], KEYS[2], KEYS[3]
local id, worker, now, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local raw = redis.call('HGET', jobs, id)
if not raw then return nil end
local doc = cjson.decode(raw)
if doc.state ~= 'running' or doc.worker ~= worker then return nil end
for k, v in pairs(cjson.decode(ARGV[5])) do doc[k] = v end
if mode == 'beat' then
  doc.heartbeat = now
  redis.call('ZADD', running, now, id)
elseif mode == 'finish' then
  doc.finished = now
  redis.call('ZREM', running, id)
else
  doc.state = 'queued'; doc.worker = cjson.null; doc.heartbeat = cjson.null
  redis.call('ZREM', running, id)
  redis.call('LPUSH', queue, id)
end
local text = cjson.encode(doc)
redis.call('HSET', jobs, id, text)
return text
