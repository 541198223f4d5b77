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
-- Fence and floor are read (a wrong-typed one raises WRONGTYPE) before anything is written.
local stored = redis.call('GET', KEYS[2])
local fence = rq_int(stored or '0')
local floor = 0
if fence then
  floor = rq_stored(redis.call('GET', KEYS[3]), KEYS[3])
end
-- The writes, in this order, because Redis undoes none of a script's writes when a later one
-- fails (an operator's ACL change refuses a command mid-script):
--   1. the lease's DEL: a script's first write decides whether a node over maxmemory refuses
--      it (DEL frees memory; after a first write, Redis lets the script's later writes through);
--   2. the floor raised to the fence, with the fence's own digits (Lua's tostring would write
--      1e14 and above in exponent form, a corrupted register);
--   3. only then the fence's DEL.
-- So a refused write leaves the fence in place, never a deleted fence above its floor.
redis.call('DEL', KEYS[1])
if fence then
  if fence > floor then
    redis.call('SET', KEYS[3], stored)
  end
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[2], '1')
return 1
