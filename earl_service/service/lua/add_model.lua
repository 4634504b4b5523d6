-- Record model ARGV[1] (its JSON in ARGV[2]) unless its owner ARGV[3] would pass a quota, in one atomic step:
-- ARGV[4] models (-1: no bound; a model already recorded, getting a new version, is not a new one) and ARGV[5]
-- bytes (-1: no bound) over every model of the owner, this one's ARGV[6] stored bytes included.
-- KEYS: models (hash id -> JSON). Returns {0} when recorded, else {1, models held} or {2, bytes held}.
local models = KEYS[1]
local id, text, owner = ARGV[1], ARGV[2], ARGV[3]
local max_models, max_bytes, stored = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if max_models >= 0 or max_bytes >= 0 then
  local count, held = 0, 0
  for _, raw in ipairs(redis.call('HVALS', models)) do
    local doc = cjson.decode(raw)
    if (doc.owner or 'default') == owner and doc.id ~= id then
      count = count + 1
      held = held + (tonumber(doc.stored) or 0)
    end
  end
  local is_new = redis.call('HEXISTS', models, id) == 0
  if is_new and max_models >= 0 and count >= max_models then return {1, count} end
  if max_bytes >= 0 and held + stored > max_bytes then return {2, held} end
end
redis.call('HSET', models, id, text)
return {0}
