-- units.lua: raise entries of a pool's unit register, guarded by the node marker. Each entry
-- is unit -> version * 2 + (1 if added, 0 if removed): the highest version wins, so a remove
-- after an add (a higher version, from the pool's fenced version sequence) hides the unit and
-- a later add shows it again.
--
-- KEYS[1]  the pool's units (rq:units:<pool>): a hash, unit -> decimal integer.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2k], ARGV[2k+1]  (k >= 1) a unit and its entry, a decimal integer below 2^53.
--
-- Returns  the number of entries raised (an entry is never lowered); -1 when the marker
--          check failed (nothing changed). An error reply for a malformed entry or a
--          corrupted stored one.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local raised = 0
for i = 2, #ARGV - 1, 2 do
  local want = rq_arg(ARGV[i + 1], 'unit entry')
  local current = rq_stored(redis.call('HGET', KEYS[1], ARGV[i]), KEYS[1] .. ' ' .. ARGV[i])
  if current < want then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    raised = raised + 1
  end
end
return raised
