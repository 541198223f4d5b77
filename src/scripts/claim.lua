-- claim.lua: one repairer at a time per node. The claim expires on the node's clock: that
-- decides only who does the work (two concurrent repairs are safe, merely wasteful).
--
-- KEYS[1]  the claim key (rq:repairing).
-- ARGV[1]  "take" (take the claim, or keep one this repairer holds), "refresh" (only while
--          this repairer still holds it: a FLUSHALL during the copy removes it) or "release".
-- ARGV[2]  the repairer's nonce.
-- ARGV[3]  claim lifetime in ms, decimal integer.
--
-- Returns  1  taken, refreshed or released; 0 another repairer holds it.
local holder = redis.call('GET', KEYS[1])
if ARGV[1] == 'release' then
  if holder == ARGV[2] then
    redis.call('DEL', KEYS[1])
  end
  return 1
end
if holder and holder ~= ARGV[2] then
  return 0
end
if ARGV[1] == 'refresh' and not holder then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', rq_arg(ARGV[3], 'claim ttl'))
return 1
