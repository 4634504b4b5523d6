-- Queue job ARGV[1] (its JSON in ARGV[2]) unless client ARGV[3] already has ARGV[4] unfinished jobs (-1: no
-- limit), in one atomic step: concurrent requests cannot all pass the count before one of them inserts.
-- KEYS: jobs (hash id -> JSON), queue (list of queued ids), running (sorted set of running ids).
-- Only the queued and running ids are read, never the whole hash. Returns -1 when queued, else the count.
local jobs, queue, running = KEYS[1], KEYS[2], KEYS[3]
local id, text, client, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if limit >= 0 then
  local count, seen = 0, {}
  local ids = redis.call('LRANGE', queue, 0, -1)
  for _, other in ipairs(redis.call('ZRANGE', running, 0, -1)) do table.insert(ids, other) end
  for _, other in ipairs(ids) do
    if not seen[other] then
      seen[other] = true
      local raw = redis.call('HGET', jobs, other)
      if raw then
        local doc = cjson.decode(raw)
        if (doc.state == 'queued' or doc.state == 'running') and type(doc.params) == 'table'
            and doc.params.client == client then
          count = count + 1
        end
      end
    end
  end
  if count >= limit then return count end
end
redis.call('HSET', jobs, id, text)
redis.call('RPUSH', queue, id)
return -1
