-- id_propose.lua: the ID generator's node step, antirez's "set if less than" for a block.
--
-- KEYS[1]  sequence key (rq:id:<name>): the highest ID this node has accepted, a decimal
--          integer string; absent means 0.
-- KEYS[2]  the node marker key (rq:marker): the run_id of the server incarnation that was
--          last verified (or repaired) to hold every value a majority accepted.
-- ARGV[1]  base: first ID of the proposed block, integer, 1 <= base.
-- ARGV[2]  last: last ID of the block, integer, base <= last < 2^53 (Lua numbers are doubles;
--          above 2^53 comparisons lie).
-- ARGV[3]  expected marker: the run_id the client saw when it connected; "*" skips the check
--          (test-only switch that disables amnesia protection).
--
-- Returns  {1, previous}  accepted: the node now stores `last`; previous is its old value.
--          {0, current}   rejected: current >= base; nothing changed.
--          {-1, current}  refused: the marker is missing or differs (the node lost its data or
--                         restarted since it was verified); nothing changed.
--          An error reply for malformed arguments; nothing changed.
local base = rq_arg(ARGV[1], 'id_propose base')
local last = rq_arg(ARGV[2], 'id_propose last')
if base < 1 or last < base then
  return redis.error_reply('ERR rq id_propose: bad block ' .. ARGV[1] .. '..' .. ARGV[2])
end
local current = rq_stored(redis.call('GET', KEYS[1]), KEYS[1])
if ARGV[3] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return {-1, current}
end
if current < base then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1, current}
end
return {0, current}
