-- seal.lua: a change of the node list seals an old node: its marker gets a suffix, so it votes
-- for no client of the old cluster any more.
--
-- KEYS[1]  the node marker (rq:marker).
-- ARGV[1]  the marker the node must hold now: "<run_id>/<old cluster id>".
-- ARGV[2]  the sealed marker: ARGV[1] .. "#sealed".
--
-- Returns  1  sealed now or before; 0 the node holds another marker (restarted, wiped or of
--          another cluster): nothing changed.
local m = redis.call('GET', KEYS[1])
if m == ARGV[2] then
  return 1
end
if m ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
