-- units_gc.lua: collect removed units (tombstones) of a pool's unit register, guarded by the
-- node marker. The collector (Units::collect_removed) reads every node, picks entries that are
-- removals on every node alike, raises the floor on every node ("floor"), and only then
-- deletes them ("delete"), each only where it still holds that very entry.
--
-- KEYS[1]  the pool's units (rq:units:<pool>): a hash, field -> decimal integer entry.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- KEYS[3]  the pool's collection floor (rq:ufloor:<pool>), see units.lua.
-- KEYS[4]  the pool's change log (rq:ulog:<pool>), see units.lua: a deleted field leaves it.
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  "floor": raise the floor to ARGV[3] (never lowered);
--          "delete": ARGV[2k+1], ARGV[2k+2] (k >= 1) a field and the entry it must still hold.
--
-- Returns  "floor": 1; "delete": the number of fields deleted; -1 when the marker check
--          failed (nothing changed). An error reply for a malformed argument.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if ARGV[2] == 'floor' then
  local want = rq_arg(ARGV[3], 'floor')
  if rq_stored(redis.call('GET', KEYS[3]), KEYS[3]) < want then
    redis.call('SET', KEYS[3], ARGV[3])
  end
  return 1
end
if ARGV[2] ~= 'delete' then
  return redis.error_reply('ERR rq: bad mode ' .. tostring(ARGV[2]))
end
local deleted = 0
for i = 3, #ARGV - 1, 2 do
  rq_arg(ARGV[i + 1], 'entry')
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[4], ARGV[i])
  end
end
return deleted
