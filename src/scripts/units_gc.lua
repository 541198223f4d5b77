-- units_gc.lua: collect removed units (tombstones) of a pool's unit register, guarded by the
-- node marker. The collector (Units::collect_removed) reads every node, picks entries that are
-- removals on every node alike, raises the floor on every node ("floor"), and only then
-- deletes them ("delete"), each only where it still holds that very entry.
--
-- KEYS[1]  the pool's units (rq:units:<pool>): a hash, field -> decimal integer entry.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- KEYS[3]  the pool's collection floor (rq:ufloor:<pool>), see units.lua.
-- KEYS[4]  the pool's change log (rq:ulog:<pool>), see units.lua.
-- KEYS[5]  the pool's change stamp (rq:ustamp:<pool>), see units.lua.
-- KEYS[6]  the log's epoch (rq:uepoch:<pool>), see units.lua.
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  "floor": raise the floor to ARGV[3] (never lowered);
--          "delete": ARGV[2k+1], ARGV[2k+2] (k >= 1) a field and the entry it must still hold.
--
-- A deletion is a change like any other for a pool leader reading the change log: the stamp
-- is raised once and every deleted field is logged at the new stamp (units_since.lua sends it
-- with an empty entry, so the leader's copy of this node drops it); `through` moves with it only
-- when the log was complete before. A log grown much larger than the register is compacted
-- by ending the epoch.
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
for i = 3, #ARGV - 1, 2 do
  rq_arg(ARGV[i + 1], 'entry')
end
local gone, seen = {}, {}
for i = 3, #ARGV - 1, 2 do
  if not seen[ARGV[i]] and redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    seen[ARGV[i]] = true
    gone[#gone + 1] = ARGV[i]
  end
end
if #gone > 0 then
  -- The stamp is raised before any field is deleted, and `through` is written last: a write
  -- refused midway (an operator's ACL change; Redis undoes no earlier write of a script)
  -- leaves `through` below the stamp, so a reader reads the whole register (as in units.lua)
  -- instead of a log that misses a deletion.
  local before = rq_stored(redis.call('GET', KEYS[5]), KEYS[5])
  local stamp = redis.call('INCR', KEYS[5])
  local s = string.format('%d', stamp)
  for _, f in ipairs(gone) do
    redis.call('HDEL', KEYS[1], f)
    redis.call('ZADD', KEYS[4], s, f)
  end
  if rq_int(redis.call('HGET', KEYS[6], 'through')) == before then
    redis.call('HSET', KEYS[6], 'through', s)
  end
  -- Compaction: collected fields stay in the log; once it is much larger than the register,
  -- the epoch ends (readers then read the whole register once, and the log restarts).
  if redis.call('ZCARD', KEYS[4]) > 2 * redis.call('HLEN', KEYS[1]) + 1000 then
    redis.call('DEL', KEYS[4])
    redis.call('HDEL', KEYS[6], 'through')
  end
end
return #gone
