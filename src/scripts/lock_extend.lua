-- lock_extend.lua: extend leases this holder still has, bumping their versions, and re-create
-- a copy on a node that lacks it (it missed the grant, or lost it) when that is safe. One call
-- extends a batch of leases (one lease, or every lease of a client due at about the same time):
-- each lease is judged on its own, exactly as if it were alone.
--
-- KEYS[1]  node marker (rq:marker).
-- KEYS[2]  the earlier release's single fence floor (rq:floor), see lock_acquire.lua.
-- Then per lease i (from 0), three keys at KEYS[3 + 3i ..]:
--   lock key (rq:lock:<name>), see lock_acquire.lua;
--   fence key (rq:fence:<name>);
--   the lock's fence floor bucket (rq:floor:<bucket>), see lock_acquire.lua.
-- ARGV[1]  expected marker (the run_id seen at connect), or "*" (test-only).
-- ARGV[2]  "x": TEST-ONLY unsafe mode (server-side expiry, never re-create), see lock_acquire.lua.
-- Then per lease i, four arguments at ARGV[3 + 4i ..]:
--   the holder's value (as passed to lock_acquire.lua);
--   the extension's version: an integer the holder raises with every extension;
--   ttl in milliseconds, integer >= 1;
--   the holder's fencing token.
--
-- Returns  -1  (an integer) marker missing or stale: nothing changed.
--          Otherwise an array with one status per lease, in order:
--           1  the key held the value: its version is now at least the given version;
--           2  there was no key and the fence was at most the token: the copy was re-created
--              (no later acquisition was granted on this node, so it blocks nobody entitled;
--              a losing contender's round is rolled back where untouched, lock_release.lua's
--              mode "undo", so it does not count). A re-created copy has no field p (see
--              lock_acquire.lua): no undo ever rolls it back;
--           0  the key holds another value (someone else's lease): nothing changed;
--          -2  no key, and the fence (or its floor bucket, which other locks share) is above
--              the token: a later acquisition may have been granted here.
--          An error reply for malformed arguments, before anything changed; or for a corrupted
--          register, after the leases before it in the batch were handled (Redis does not
--          undo a script's writes): the client counts the whole node as not answering, which
--          only costs those leases an extension.
local leases = (#KEYS - 2) / 3
if leases < 1 or leases ~= math.floor(leases) or #ARGV ~= 2 + 4 * leases then
  return redis.error_reply('ERR rq lock_extend: keys and arguments do not form whole leases')
end
for i = 0, leases - 1 do
  local a = 3 + 4 * i
  local version = rq_arg(ARGV[a + 1], 'lock_extend version')
  local ttl = rq_arg(ARGV[a + 2], 'lock_extend ttl')
  local token = rq_arg(ARGV[a + 3], 'lock_extend token')
  if version < 1 or ttl < 1 or token < 1 then
    return redis.error_reply('ERR rq lock_extend: bad version, ttl or token')
  end
end
if ARGV[1] ~= '*' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
-- The single floor matters only to a re-created copy: read once, by the first lease that needs
-- it (an extension of a held copy runs three commands: the marker, HMGET, HSET).
local legacy_floor = nil
local out = {}
for i = 0, leases - 1 do
  local k = 3 + 3 * i
  local lock, fence_key, bucket = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local a = 3 + 4 * i
  local value, version, ttl, token = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local status
  local held = redis.call('HMGET', lock, 'v', 'n')
  local cur = held[1]
  if cur == value then
    local n = rq_stored(held[2], lock .. ' n')
    if tonumber(version) > n then
      redis.call('HSET', lock, 'n', version, 't', ttl)
    end
    if ARGV[2] == 'x' then
      redis.call('PEXPIRE', lock, tonumber(ttl))
    end
    status = 1
  elseif cur or ARGV[2] == 'x' then
    status = 0
  else
    if legacy_floor == nil then
      legacy_floor = rq_stored(redis.call('GET', KEYS[2]), KEYS[2])
    end
    local fence = math.max(rq_stored(redis.call('GET', fence_key), fence_key),
      rq_stored(redis.call('GET', bucket), bucket), legacy_floor)
    if fence > tonumber(token) then
      status = -2
    else
      -- The fence first (see lock_acquire.lua), then the copy.
      if fence < tonumber(token) then
        redis.call('SET', fence_key, token)
      end
      redis.call('HSET', lock, 'v', value, 'n', version, 't', ttl)
      status = 2
    end
  end
  out[#out + 1] = status
end
return out
