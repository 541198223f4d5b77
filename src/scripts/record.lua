-- record.lua: raise one field of a hash of integers (completion records of periodic jobs:
-- period -> token; acknowledgements of prepared views: member -> view token), guarded by the
-- node marker.
--
-- KEYS[1]  the hash (rq:done:<job> or rq:ack:<group>).
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  the field.
-- ARGV[2]  the value, a decimal integer below 2^53.
-- ARGV[3]  expected marker, or "*" (test-only).
-- ARGV[4]  optional: a companion field, set to ARGV[5] as it is (an acknowledgement's
--          "<token>:<view digest>", naming the content it acknowledges).
--
-- Returns  {1, previous}  the field now holds at least ARGV[2] (never lowered).
--          {-1, current}  marker missing or stale: nothing changed.
--          An error reply for a malformed value or a corrupted field.
local want = rq_arg(ARGV[2], 'record value')
local current = rq_stored(redis.call('HGET', KEYS[1], ARGV[1]), KEYS[1] .. ' ' .. ARGV[1])
if ARGV[3] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return {-1, current}
end
if current < want then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
if ARGV[4] and ARGV[5] then
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
end
return {1, current}
