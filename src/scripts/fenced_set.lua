-- fenced_set.lua: the resource-side fencing guard for a Redis resource. Apply a write only
-- if its fencing token is at least the highest token seen for that resource.
--
-- KEYS[1]  the resource key to write.
-- KEYS[2]  the resource's fence key (the highest token seen), a decimal integer string.
-- ARGV[1]  the writer's fencing token, integer, 1 <= token < 2^53.
-- ARGV[2]  the value to store in KEYS[1].
--
-- Returns  {1, token}    applied: KEYS[1] = ARGV[2], KEYS[2] = token.
--          {0, highest}  rejected: a newer holder (higher token) already wrote; nothing changed.
local token = rq_int(ARGV[1])
if not token or token < 1 then
  return redis.error_reply('ERR rq fenced_set: bad token ' .. tostring(ARGV[1]))
end
local highest = rq_stored(redis.call('GET', KEYS[2]), KEYS[2])
if token < highest then
  return {0, highest}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, token}
