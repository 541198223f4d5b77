-- restore.lua: repair step for state that is not a plain monotonic register. Fills in what a
-- quarantined node lost, from what a majority of the other nodes hold; never removes anything,
-- never moves a value backwards, and writes only while the node carries the repairer's claim
-- (a repairer that lost its claim, or a node emptied by FLUSHALL since the copy began, takes
-- nothing).
--
-- KEYS[1]  the repair claim (rq:repairing).
-- KEYS[2]  the key to restore.
-- KEYS[3]  for mode "lease": the lock's fence key (rq:fence:<name> or rq:gfence:<group>); for
--          mode "units": the pool's collection floor (rq:ufloor:<pool>); otherwise KEYS[2]
--          again (unused).
-- ARGV[1]  the repairer's claim nonce.
-- ARGV[2]  mode:
--          "lease"  KEYS[2] is a lock key (hash v, n, t, see lock_acquire.lua; a copy written
--                   here has no field p, so no round's undo rolls it back); ARGV[3..6] are
--                   its value, version, ttl ms and token; ARGV[7] the holder text of a blocker.
--                   Nothing is written if the node has a key. If its fence (already raised,
--                   perhaps from another page read earlier) is at most the token, the copy is
--                   written; if the fence is above it, a later grant was made and may since
--                   have been released on the sources, so which holder this node granted last
--                   is unknown: a BLOCKER is written instead (value
--                   "repair-blocker:<fence>:<ARGV[7]>", version 1, the copy's ttl), which no
--                   client holds and only a takeover removes. Either way a node that lost a
--                   grant some source still shows is never left free.
--          "max"    KEYS[2] is a hash of field -> integer (completion records, acks); ARGV[3..]
--                   are field, value pairs; each field is raised to at least the value.
--          "units"  as "max", for a pool's unit register (see units.lua): in addition a removal
--                   (an even entry) below the pool's collection floor is not written (it was
--                   collected, or is about to be).
--          "beat"   KEYS[2] is a hash of membership beats (member key -> beat sequence, or
--                   "left", see member_beat.lua); ARGV[3..] are field, value pairs; each field
--                   is raised to at least the value, "left" above any sequence: a beat never
--                   goes back to a value a leader may already have seen.
--
-- Returns  the number of keys or fields written; -1 when the claim is not the repairer's
--          (nothing changed).
if not rq_claimed(KEYS[1], ARGV[1]) then
  return -1
end
local mode = ARGV[2]
if mode == 'lease' then
  local token = rq_arg(ARGV[6], 'restore token')
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return 0
  end
  local raw = redis.call('GET', KEYS[3])
  local fence = rq_stored(raw, KEYS[3])
  if fence > token then
    redis.call('HSET', KEYS[2], 'v', 'repair-blocker:' .. raw .. ':' .. ARGV[7], 'n', '1', 't', ARGV[5])
    return 1
  end
  -- The fence first: a copy's token is never above its node's fence, even when the copy's
  -- write is refused after it (Redis undoes no earlier write of a script).
  if fence < token then
    redis.call('SET', KEYS[3], ARGV[6])
  end
  redis.call('HSET', KEYS[2], 'v', ARGV[3], 'n', ARGV[4], 't', ARGV[5])
  return 1
end
local floor = 0
if mode == 'units' then
  floor = rq_stored(redis.call('GET', KEYS[3]), KEYS[3])
end
local written = 0
for i = 3, #ARGV - 1, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', KEYS[2], field)
  if mode == 'max' or mode == 'units' then
    local want = rq_int(value)
    local collected = mode == 'units' and want and want % 2 == 0 and want < floor
    if want and not collected and (not cur or rq_stored(cur, KEYS[2] .. ' ' .. field) < want) then
      redis.call('HSET', KEYS[2], field, value)
      written = written + 1
    end
  elseif mode == 'beat' then
    local want = rq_int(value)
    local higher
    if value == 'left' then
      higher = cur ~= 'left'
    elseif want then
      higher = not cur or (cur ~= 'left' and (rq_int(cur) or 0) < want)
    end
    if higher then
      redis.call('HSET', KEYS[2], field, value)
      written = written + 1
    end
  elseif mode == 'absent' then
    if not cur then
      redis.call('HSET', KEYS[2], field, value)
      written = written + 1
    end
  else
    return redis.error_reply('ERR rq restore: bad mode')
  end
end
return written
