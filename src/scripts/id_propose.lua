-- id_propose.lua: the ID generator's node step, antirez's "set if less than" for a block, for
-- one sequence or several (proposals of a client's sequences due together share one call);
-- each proposal is judged on its own, exactly as if it were alone.
--
-- KEYS[1]  the node marker key (rq:marker): the run_id of the server incarnation that was
--          last verified (or repaired) to hold every value a majority accepted.
-- KEYS[1 + i]  (i = 1 ..) sequence key (rq:id:<name>) of proposal i: the highest ID this node
--          has accepted, a decimal integer string; absent means 0.
-- ARGV[1]  expected marker: the run_id the client saw when it connected; "*" skips the check
--          (test-only switch that disables amnesia protection).
-- ARGV[2i], ARGV[2i + 1]  proposal i's block: base, its first ID, integer, 1 <= base; last,
--          its last ID, base <= last < 2^53 (Lua numbers are doubles; above 2^53 comparisons
--          lie).
--
-- Returns  an array of two integers per proposal, in order:
--          1, previous   accepted: the node now stores `last`; previous was its old value;
--          0, current    rejected: current >= base; nothing changed;
--         -1, current    refused: the marker is missing or differs (the node lost its data or
--                        restarted since it was verified); nothing changed (every proposal of
--                        the call is refused).
--          An error reply for malformed arguments, before anything changed; or for a corrupted
--          register, after the proposals before it in the batch were handled (Redis does not
--          undo a script's writes): the client counts the whole node as not answering, and
--          a proposal it does not count is at worst a gap.
local n = #KEYS - 1
if n < 1 or #ARGV ~= 1 + 2 * n then
  return redis.error_reply('ERR rq id_propose: keys and arguments do not form whole proposals')
end
local blocks = {}
for i = 1, n do
  local base = rq_arg(ARGV[2 * i], 'id_propose base')
  local last = rq_arg(ARGV[2 * i + 1], 'id_propose last')
  if base < 1 or last < base then
    return redis.error_reply('ERR rq id_propose: bad block ' .. ARGV[2 * i] .. '..' .. ARGV[2 * i + 1])
  end
  blocks[i] = base
end
local refused = ARGV[1] ~= '*' and redis.call('GET', KEYS[1]) ~= ARGV[1]
local out = {}
for i = 1, n do
  local current = rq_stored(redis.call('GET', KEYS[1 + i]), KEYS[1 + i])
  if refused then
    out[#out + 1] = -1
  elseif current < blocks[i] then
    redis.call('SET', KEYS[1 + i], ARGV[2 * i + 1])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  out[#out + 1] = current
end
return out
