-- restore.lua: repair step for state that is not a plain monotonic register. Fills in what a
-- quarantined node lost, from what a majority of the other nodes hold; never removes anything.
--
-- KEYS[1]  the key to restore.
-- KEYS[2]  for mode "lease": the lock's fence key (rq:fence:<name> or rq:gfence:<group>).
-- ARGV[1]  mode:
--          "lease"  KEYS[1] is a lock key (hash v, n, t, see lock_acquire.lua); ARGV[2..5] are
--                   its value, version, ttl ms and token; ARGV[6] the holder text of a blocker.
--                   Nothing is written if the node has a key. If its fence (already raised,
--                   perhaps from another page read earlier) is at most the token, the copy is
--                   written; if the fence is above it, a later grant was made and may since
--                   have been released on the sources, so which holder this node granted last
--                   is unknown: a BLOCKER is written instead (value
--                   "repair-blocker:<fence>:<ARGV[6]>", version 1, the copy's ttl), which no
--                   client holds and only a takeover removes. Either way a node that lost a
--                   grant some source still shows is never left free.
--          "max"    KEYS[1] is a hash of field -> integer (completion records, acks); ARGV[2..]
--                   are field, value pairs; each field is raised to at least the value.
--          "absent" KEYS[1] is a hash (membership beats); ARGV[2..] are field, value pairs; a
--                   field is written only if the node lacks it.
--
-- Returns  the number of keys or fields written.
local mode = ARGV[1]
if mode == 'lease' then
  local token = rq_arg(ARGV[5], 'restore token')
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
  local raw = redis.call('GET', KEYS[2])
  local fence = rq_stored(raw, KEYS[2])
  if fence > token then
    redis.call('HSET', KEYS[1], 'v', 'repair-blocker:' .. raw .. ':' .. ARGV[6], 'n', '1', 't', ARGV[4])
    return 1
  end
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'n', ARGV[3], 't', ARGV[4])
  if fence < token then
    redis.call('SET', KEYS[2], ARGV[5])
  end
  return 1
end
local written = 0
for i = 2, #ARGV - 1, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', KEYS[1], field)
  if mode == 'max' then
    local want = rq_int(value)
    if want and (not cur or rq_stored(cur, KEYS[1] .. ' ' .. field) < want) then
      redis.call('HSET', KEYS[1], field, value)
      written = written + 1
    end
  elseif mode == 'absent' then
    if not cur then
      redis.call('HSET', KEYS[1], field, value)
      written = written + 1
    end
  else
    return redis.error_reply('ERR rq restore: bad mode')
  end
end
return written
