-- prune.lua: garbage collection of a hash of integers (acknowledgements: member -> view
-- token; completion records: period -> token), guarded by the node marker.
--
-- KEYS[1]  the hash.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  threshold: fields whose value is below it are deleted (0: none by value).
-- ARGV[2]  keep: then, while more than this many fields remain, the lowest-valued ones are
--          deleted (0: no limit); among equal values, begin marks first.
-- ARGV[3]  expected marker, or "*" (test-only).
--
-- Returns  the number of fields deleted; -1 when the marker check failed (nothing changed).
-- A field whose value is not an integer (corrupted) counts as 0.
local threshold = rq_arg(ARGV[1], 'prune threshold')
local keep = rq_arg(ARGV[2], 'prune keep')
if ARGV[3] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return -1
end
local all = redis.call('HGETALL', KEYS[1])
local fields = {}
local deleted = 0
for i = 1, #all, 2 do
  local v = rq_int(all[i + 1]) or 0
  if v < threshold then
    redis.call('HDEL', KEYS[1], all[i])
    deleted = deleted + 1
  else
    fields[#fields + 1] = {all[i], v}
  end
end
if keep > 0 and #fields > keep then
  -- Lowest value first; among equal values a job's begin mark (a field starting with the unit
  -- separator, byte 31) before the record of the same run, then by name: a record is never
  -- dropped while the begin mark of its own run stays.
  table.sort(fields, function(a, b)
    if a[2] ~= b[2] then
      return a[2] < b[2]
    end
    local am, bm = string.byte(a[1], 1) == 31, string.byte(b[1], 1) == 31
    if am ~= bm then
      return am
    end
    return a[1] < b[1]
  end)
  for i = 1, #fields - keep do
    redis.call('HDEL', KEYS[1], fields[i][1])
    deleted = deleted + 1
  end
end
return deleted
