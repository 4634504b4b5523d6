-- Claim a job for ARGV[1] in one atomic step: first a running job whose heartbeat is older than ARGV[3]
-- (cancelled if that was asked for, failed after ARGV[4] attempts, else taken over), then the oldest queued one.
-- KEYS: jobs (hash id -> JSON), queue (list of queued ids), running (sorted set scored by heartbeat).
-- Returns the claimed job's JSON, or nil when there is nothing to do.
local jobs, queue, running = KEYS[1], KEYS[2], KEYS[3]
local worker, now, stale, max_attempts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function take(id, doc)
  doc.state = 'running'; doc.worker = worker; doc.heartbeat = now
  if doc.started == nil or doc.started == cjson.null then doc.started = now end
  doc.attempts = (tonumber(doc.attempts) or 0) + 1
  local text = cjson.encode(doc)
  redis.call('HSET', jobs, id, text)
  redis.call('ZADD', running, now, id)
  return text
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', running, '-inf', '(' .. stale)) do
  local raw = redis.call('HGET', jobs, id)
  if not raw then
    redis.call('ZREM', running, id)
  else
    local doc = cjson.decode(raw)
    if doc.state ~= 'running' then
      redis.call('ZREM', running, id)
    elseif doc.cancel_requested == true then
      doc.state = 'cancelled'; doc.finished = now; doc.worker = cjson.null
      redis.call('HSET', jobs, id, cjson.encode(doc)); redis.call('ZREM', running, id)
    elseif (tonumber(doc.attempts) or 0) >= max_attempts then
      doc.state = 'failed'; doc.finished = now; doc.worker = cjson.null
      doc.error = 'the worker stopped responding ' .. doc.attempts .. ' time(s); giving up'
      redis.call('HSET', jobs, id, cjson.encode(doc)); redis.call('ZREM', running, id)
    else
      return take(id, doc)
    end
  end
end
while true do
  local id = redis.call('LPOP', queue)
  if not id then return nil end
  local raw = redis.call('HGET', jobs, id)
  if raw then
    local doc = cjson.decode(raw)
    if doc.state == 'queued' then return take(id, doc) end
  end
end
