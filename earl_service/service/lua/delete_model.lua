-- Delete model ARGV[1] and clear the model_id of the job that produced it (the record's job_id), so that no
-- job points at a deleted model. Returns 1 when the model existed, else 0.
local jobs, models = KEYS[1], KEYS[2]
local id = ARGV[1]
local raw = redis.call('HGET', models, id)
if not raw then return 0 end
redis.call('HDEL', models, id)
local job_id = cjson.decode(raw).job_id
if type(job_id) ~= 'string' then return 1 end
local text = redis.call('HGET', jobs, job_id)
if not text then return 1 end
local doc = cjson.decode(text)
if doc.model_id == id then
  doc.model_id = cjson.null
  redis.call('HSET', jobs, job_id, cjson.encode(doc))
end
return 1
