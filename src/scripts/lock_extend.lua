-- lock_extend.lua: extend a lease this holder still has, bumping its version, and re-create the
-- copy on a node that lacks it (it missed the grant, or lost it) when that is safe.
--
-- KEYS[1]  lock key (rq:lock:<name>), see lock_acquire.lua.
-- KEYS[2]  fence key (rq:fence:<name>).
-- KEYS[3]  node marker (rq:marker).
-- KEYS[4]  the lock's fence floor bucket (rq:floor:<bucket>), see lock_acquire.lua.
-- KEYS[5]  the earlier release's single fence floor (rq:floor), see lock_acquire.lua.
-- ARGV[1]  the holder's value (as passed to lock_acquire.lua).
-- ARGV[2]  the extension's version: an integer the holder raises with every extension.
-- ARGV[3]  ttl in milliseconds, integer >= 1.
-- ARGV[4]  the holder's fencing token.
-- ARGV[5]  expected marker (the run_id seen at connect), or "*" (test-only).
-- ARGV[6]  "x": TEST-ONLY unsafe mode (server-side expiry, never re-create), see lock_acquire.lua.
--
-- Returns   1  the key held ARGV[1]: its version is now at least ARGV[2];
--           2  there was no key and the fence was at most the token: the copy was re-created
--              (no later acquisition was granted on this node, so it blocks nobody entitled);
--           0  the key holds another value (someone else's lease): nothing changed;
--          -2  no key, and the fence (or its floor bucket, which other locks share) is above
--              the token: a later acquisition may have been granted here;
--          -1  marker missing or stale: nothing changed.
local version = rq_arg(ARGV[2], 'lock_extend version')
local ttl = rq_arg(ARGV[3], 'lock_extend ttl')
local token = rq_arg(ARGV[4], 'lock_extend token')
if version < 1 or ttl < 1 or token < 1 then
  return redis.error_reply('ERR rq lock_extend: bad version, ttl or token')
end
if ARGV[5] ~= '*' and redis.call('GET', KEYS[3]) ~= ARGV[5] then
  return -1
end
local cur = redis.call('HGET', KEYS[1], 'v')
if cur == ARGV[1] then
  local n = rq_stored(redis.call('HGET', KEYS[1], 'n'), KEYS[1] .. ' n')
  if version > n then
    redis.call('HSET', KEYS[1], 'n', ARGV[2], 't', ARGV[3])
  end
  if ARGV[6] == 'x' then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 1
end
if cur then
  return 0
end
if ARGV[6] == 'x' then
  return 0
end
local fence = math.max(rq_stored(redis.call('GET', KEYS[2]), KEYS[2]),
  rq_stored(redis.call('GET', KEYS[4]), KEYS[4]),
  rq_stored(redis.call('GET', KEYS[5]), KEYS[5]))
if fence > token then
  return -2
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'n', ARGV[2], 't', ARGV[3])
if fence < token then
  redis.call('SET', KEYS[2], ARGV[4])
end
return 2
