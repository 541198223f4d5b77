-- lock_release.lua: compare-and-delete, and garbage collection of the lock's fence.
--
-- KEYS[1]  lock key (rq:lock:<name>), see lock_acquire.lua.
-- KEYS[2]  the lock's fence key (rq:fence:<name>).
-- KEYS[3]  the lock's fence floor bucket (rq:floor:<bucket>): raised to the fence before the
--          fence key is deleted, so a later grant of this lock (which counts from
--          max(fence, floor)) still gets a higher token, and a lock not in use keeps no key of
--          its own (see src/lock/fold.rs for when a fence key stays behind).
-- KEYS[4]  (mode "collect") the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  the holder's value ("" in mode "collect").
-- ARGV[2]  pub/sub channel to notify waiters on (rq:released:<name>).
-- ARGV[3]  mode (absent: "fold", as older clients send it):
--          "fold"     delete the holder's copy, then fold the fence into the floor;
--          "keep"     delete the holder's copy only: the fence key stays, to be rewritten by
--                     the lock's next grant (a lock acquired again and again: two writes fewer
--                     per cycle) or folded later with "collect";
--          "collect"  delete nothing but the fence: fold it into the floor, only on a node
--                     holding the expected marker and no key at KEYS[1] (a copy, anyone's,
--                     keeps its fence key).
-- ARGV[4]  (mode "collect") expected marker, or "*" (test-only).
--
-- Returns  1 if the key held ARGV[1] and was deleted (waiters are notified), or ("collect")
--          if the fence was folded; 0 otherwise (someone else's lock is never touched; for a
--          collect: no fence, or a key at KEYS[1]); -1 (collect only) marker missing or stale.
-- No marker check for "fold" and "keep": deleting one's own copy, and folding its fence into
-- a floor no lower than it, is safe on any node, verified or not. A collect is checked: a node
-- under repair (unmarked) may have been given a fence that its restore of a lease copy must
-- still read (restore.lua reads the fence key, not the floor).
local mode = ARGV[3] or 'fold'
if mode == 'collect' then
  if ARGV[4] ~= '*' and redis.call('GET', KEYS[4]) ~= ARGV[4] then
    return -1
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
elseif mode ~= 'fold' and mode ~= 'keep' then
  return redis.error_reply('ERR rq lock_release: bad mode')
elseif redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then
  return 0
end
if mode == 'keep' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
-- Fence and floor are read (a wrong-typed one raises WRONGTYPE) before anything is written.
local stored = redis.call('GET', KEYS[2])
if mode == 'collect' and not stored then
  return 0
end
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
-- So a refused write leaves the fence in place, never a deleted fence above its floor. (A
-- "collect" has no lease to delete: a node over maxmemory refuses its floor write, and the
-- fence stays.)
if mode == 'fold' then
  redis.call('DEL', KEYS[1])
end
if fence then
  if fence > floor then
    redis.call('SET', KEYS[3], stored)
  end
  redis.call('DEL', KEYS[2])
end
if mode == 'collect' then
  return fence and 1 or 0
end
redis.call('PUBLISH', ARGV[2], '1')
return 1
