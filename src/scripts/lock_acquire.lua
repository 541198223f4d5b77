-- lock_acquire.lua: grant a lease AND mint its fencing token, in one atomic step per node.
--
-- KEYS[1]  lock key (rq:lock:<name>): the holder's value, with a TTL.
-- KEYS[2]  fence key (rq:fence:<name>): the highest token granted with this lock, a decimal
--          integer string, no TTL (one per lock name).
-- KEYS[3]  node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  value: the acquisition's random value (32 hex digits, 128 bits from the OS CSPRNG)
--          followed by optional holder information.
-- ARGV[2]  ttl in milliseconds, integer >= 1.
-- ARGV[3]  proposed token, integer, 1 <= token < 2^53.
-- ARGV[4]  expected marker (the run_id seen at connect), or "*" to skip (test-only).
--
-- Returns  {1, previous_fence}  granted: the lock now holds ARGV[1] for ttl ms and the fence
--                               holds the token (which was above previous_fence).
--          {0, fence}           the lock is held by another value; nothing changed.
--          {-2, fence}          the lock is free but fence >= token: propose above fence.
--          {-1, fence}          marker missing or stale: the node may not vote.
-- A node grants only when the lock is free AND its fence is below the token, so a token
-- granted by a majority is above every token granted by a majority before it.
local ttl = tonumber(ARGV[2])
local token = tonumber(ARGV[3])
if not ttl or ttl < 1 or not token or token < 1 or token >= 9007199254740992 then
  return redis.error_reply('ERR rq lock_acquire: bad ttl or token')
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if ARGV[4] ~= '*' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return {-1, fence}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, fence}
end
if fence >= token then
  return {-2, fence}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('SET', KEYS[2], ARGV[3])
return {1, fence}
