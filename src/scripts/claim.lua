-- claim.lua: one repairer at a time per node. The claim never expires on the node (no node
-- clock decides anything): its value is `<nonce>:<count>`, the count raised by every refresh,
-- and a claim left by a repairer that died is taken over by another repairer that watched it
-- unchanged for the claim's lifetime on its own monotonic clock ("takeover"). The claim only
-- decides who does the work: every write of a repair checks it atomically (raise.lua,
-- restore.lua, view_write.lua, mark.lua), so a repairer that lost it writes nothing.
--
-- KEYS[1]  the claim key (rq:repairing).
-- KEYS[2]  the node marker (rq:marker).
-- ARGV[1]  "take" (take a free claim, or keep one this repairer holds), "refresh" (only while
--          this repairer still holds it: a FLUSHALL during the copy removes it), "takeover"
--          (replace exactly the value ARGV[3]) or "release".
-- ARGV[2]  the repairer's nonce (hex digits).
-- ARGV[3]  for "takeover": the claim value the repairer watched unchanged.
-- ARGV[4]  for "take" and "takeover": the marker the repairer's census found on the node ("":
--          none). A claim is taken only while the node still holds exactly that: a node marked
--          since (another repair finished) is not copied onto with an older census.
-- ARGV[5]  TEST ONLY (`with_server_clock_leases_for_tests`): milliseconds after which the node
--          expires the claim on its own wall clock (the rule before issue 27), or 0: never.
--
-- Returns  1  taken, refreshed, taken over or released; -2 the node's marker is not the one
--          expected (nothing changed); otherwise the claim's current value (another
--          repairer's, to watch), or 0 when there is none ("refresh": the claim was lost).
local px = rq_arg(ARGV[5], 'claim expiry')
-- Write the claim value `v` (with the test-only node-clock expiry, if any).
local function put(v)
  if px > 0 then
    redis.call('SET', KEYS[1], v, 'PX', px)
  else
    redis.call('SET', KEYS[1], v)
  end
end
local holder = redis.call('GET', KEYS[1])
local mine = rq_claimed(KEYS[1], ARGV[2])
if ARGV[1] == 'release' then
  if mine then
    redis.call('DEL', KEYS[1])
  end
  return 1
end
if ARGV[1] == 'refresh' then
  if not mine then
    return holder or 0
  end
  local count = tonumber(string.match(holder, ':(%d+)$') or '0') or 0
  put(ARGV[2] .. ':' .. string.format('%d', count + 1))
  return 1
end
if (ARGV[1] == 'take' or ARGV[1] == 'takeover') and (redis.call('GET', KEYS[2]) or '') ~= ARGV[4] then
  return -2
end
if ARGV[1] == 'take' then
  if mine then
    return 1
  end
  if holder then
    return holder
  end
  put(ARGV[2] .. ':0')
  return 1
end
if ARGV[1] == 'takeover' then
  if holder ~= ARGV[3] then
    return holder or 0
  end
  put(ARGV[2] .. ':0')
  return 1
end
return redis.error_reply('ERR rq claim: bad mode')
