-- units.lua: raise entries of a pool's unit register, guarded by the node marker. Each entry
-- is unit -> version * 2 + (1 if added, 0 if removed): the highest version wins, so a remove
-- after an add (a higher version, from the pool's fenced version sequence) hides the unit and
-- a later add shows it again.
--
-- KEYS[1]  the pool's units (rq:units:<pool>): a hash, unit -> decimal integer.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- KEYS[3]  the pool's change stamp on this node (rq:ustamp:<pool>): raised by one with every
--          call that passes the marker check, started at ARGV[2] where missing, so a pool
--          leader that saw the same stamp on a node (same marker) knows nothing changed there.
-- KEYS[4]  the pool's collection floor (rq:ufloor:<pool>): entries below it are refused, so
--          a write delayed in the network cannot bring back a unit whose removal (tombstone)
--          was collected (units_gc.lua raises it on every node before deleting anything).
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  the stamp's start where missing: a random decimal integer below 2^40.
-- ARGV[2k+1], ARGV[2k+2]  (k >= 1) a unit and its entry, a decimal integer below 2^53.
--
-- Returns  the number of entries raised (an entry is never lowered); -1 when the marker
--          check failed, -2 when an entry is below the floor (nothing changed either way:
--          the caller retries with new versions). An error reply for a malformed entry or a
--          corrupted stored one.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local floor = rq_stored(redis.call('GET', KEYS[4]), KEYS[4])
for i = 3, #ARGV - 1, 2 do
  if rq_arg(ARGV[i + 1], 'unit entry') < floor then
    return -2
  end
end
local start = rq_arg(ARGV[2], 'stamp start')
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('SET', KEYS[3], start)
end
rq_stored(redis.call('GET', KEYS[3]), KEYS[3])
redis.call('INCR', KEYS[3])
local raised = 0
for i = 3, #ARGV - 1, 2 do
  local want = rq_arg(ARGV[i + 1], 'unit entry')
  local current = rq_stored(redis.call('HGET', KEYS[1], ARGV[i]), KEYS[1] .. ' ' .. ARGV[i])
  if current < want then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    raised = raised + 1
  end
end
return raised
