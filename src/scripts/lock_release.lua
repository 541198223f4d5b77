-- lock_release.lua: compare-and-delete, and garbage collection of the lock's fence.
--
-- KEYS[1]  lock key (rq:lock:<name>), see lock_acquire.lua.
-- KEYS[2]  the lock's fence key (rq:fence:<name>).
-- KEYS[3]  the lock's fence floor bucket (rq:floor:<bucket>): raised to the fence before the
--          fence key is deleted, so a later grant of this lock (which counts from
--          max(fence, floor)) still gets a higher token, and a node keeps at most one floor per
--          bucket instead of one fence key per lock name forever.
-- ARGV[1]  the holder's value.
-- ARGV[2]  pub/sub channel to notify waiters on (rq:released:<name>).
--
-- Returns  1 if the key held ARGV[1] and was deleted (waiters are notified); 0 otherwise
--          (someone else's lock is never touched).
-- No marker check: deleting one's own copy is safe on any node, verified or not.
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then
  return 0
end
-- Both registers are read (a wrong-typed one raises WRONGTYPE) before anything is written, and
-- the DEL of lease and fence comes before the floor's SET: a script's first write decides
-- whether a node over maxmemory refuses it, and DEL frees memory.
local fence = rq_int(redis.call('GET', KEYS[2]) or '0')
if fence then
  local floor = rq_stored(redis.call('GET', KEYS[3]), KEYS[3])
  redis.call('DEL', KEYS[1], KEYS[2])
  if fence > floor then
    redis.call('SET', KEYS[3], tostring(fence))
  end
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[2], '1')
return 1
