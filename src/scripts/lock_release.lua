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
--                     keeps its fence key);
--          "undo"     the undo of an acquisition round that no caller was given (not granted
--                     by a majority in time, or its caller went away): ROLL BACK the round's
--                     grant where it is untouched, i.e. the key holds ARGV[1] at version 1
--                     with the field p that only lock_acquire.lua writes (never extended,
--                     swapped, re-created or restored since) and the fence key holds exactly
--                     the round's token ARGV[4] (no later grant, raise or fold): delete the
--                     copy and set the fence key back to p, its value before the grant (0:
--                     delete it), the floor untouched. Anywhere else, exactly "fold". Why it
--                     is safe: src/lock/mod.rs ("An undone round"). Why: a holder's copy on a
--                     node that missed its grant is re-created by its extensions only while
--                     that node's fence is at most the holder's token (lock_extend.lua), which
--                     a losing token folded into the floor is not, for good.
-- ARGV[4]  (mode "collect") expected marker, or "*" (test-only); (mode "undo") the round's
--          token.
--
-- Returns  1 if the key held ARGV[1] and was deleted (waiters are notified), or ("collect")
--          if the fence was folded; 2 ("undo") if the grant was rolled back (the copy deleted,
--          waiters notified); 0 otherwise (someone else's lock is never touched; for a
--          collect: no fence, or a key at KEYS[1]); -1 (collect only) marker missing or stale.
-- No marker check for "fold", "keep" and "undo": deleting one's own copy, and folding its
-- fence into a floor no lower than it, is safe on any node, verified or not; a rollback needs
-- none either (its p and its token compared with the fence key say that nothing happened to
-- the lock on this node since the grant; a node that lost the grant has no p: see
-- src/lock/mod.rs). A collect is checked: a node under repair (unmarked) may have been given a
-- fence that its restore of a lease copy must still read (restore.lua reads the fence key,
-- not the floor).
local mode = ARGV[3] or 'fold'
if mode == 'undo' then
  local token = rq_arg(ARGV[4], 'lock_release undo token')
  local cur = redis.call('HMGET', KEYS[1], 'v', 'n', 'p')
  if cur[1] ~= ARGV[1] then
    return 0
  end
  if cur[3] and rq_stored(cur[2], KEYS[1] .. ' n') == 1
      and rq_stored(redis.call('GET', KEYS[2]), KEYS[2]) == token then
    local before = rq_stored(cur[3], KEYS[1] .. ' p')
    -- The copy's DEL first (a node over maxmemory refuses a script by its first write; DEL
    -- frees memory), then the fence key: a refused second write leaves the fence at the
    -- token, higher, which is safe (it is then as if folded, without the floor).
    redis.call('DEL', KEYS[1])
    if before == 0 then
      redis.call('DEL', KEYS[2])
    elseif before < token then
      redis.call('SET', KEYS[2], cur[3])
    end
    redis.call('PUBLISH', ARGV[2], '1')
    return 2
  end
  mode = 'fold'
end
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
