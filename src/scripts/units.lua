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
-- KEYS[5]  the pool's change log on this node (rq:ulog:<pool>): a sorted set, field -> the
--          stamp of the call that last raised it, so a leader that read this node at stamp s
--          reads only the fields raised since (units_since.lua).
-- KEYS[6]  the log's epoch on this node (rq:uepoch:<pool>): a hash with `id` (random),
--          `bind` (the marker and the node's last repair, `<marker>|<rq:marked>`) and
--          `through` (the stamp the log covers up to). The log restarts under a new id when
--          the bind changed (the node restarted or was repaired: entries may have arrived by a
--          copy that logs nothing) or when `through` is not the stamp before this call (a
--          write that did not log, e.g. by an older client).
-- KEYS[7]  the node's last repair nonce (rq:marked), written by mark.lua.
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  the stamp's start where missing: a random decimal integer below 2^40.
-- ARGV[3]  a new epoch id (random), used if the log restarts.
-- ARGV[2k+2], ARGV[2k+3]  (k >= 1) a unit and its entry, a decimal integer below 2^53.
--
-- Returns  the number of entries raised (an entry is never lowered); -1 when the marker
--          check failed, -2 when an entry is below the floor (nothing changed either way:
--          the caller retries with new versions). An error reply for a malformed entry or a
--          corrupted stored one.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local floor = rq_stored(redis.call('GET', KEYS[4]), KEYS[4])
for i = 4, #ARGV - 1, 2 do
  if rq_arg(ARGV[i + 1], 'unit entry') < floor then
    return -2
  end
end
local start = rq_arg(ARGV[2], 'stamp start')
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('SET', KEYS[3], start)
end
rq_stored(redis.call('GET', KEYS[3]), KEYS[3])
local stamp = redis.call('INCR', KEYS[3])
local s = string.format('%d', stamp)
local bind = ARGV[1] .. '|' .. (redis.call('GET', KEYS[7]) or '')
local ep = redis.call('HMGET', KEYS[6], 'id', 'bind', 'through')
if not (ep[1] and ep[2] == bind and rq_int(ep[3]) == stamp - 1) then
  redis.call('DEL', KEYS[5])
  redis.call('HSET', KEYS[6], 'id', ARGV[3], 'bind', bind)
end
local raised = 0
for i = 4, #ARGV - 1, 2 do
  local want = rq_arg(ARGV[i + 1], 'unit entry')
  local current = rq_stored(redis.call('HGET', KEYS[1], ARGV[i]), KEYS[1] .. ' ' .. ARGV[i])
  if current < want then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    redis.call('ZADD', KEYS[5], s, ARGV[i])
    raised = raised + 1
  end
end
redis.call('HSET', KEYS[6], 'through', s)
return raised
