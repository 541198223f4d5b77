-- plist.lua: the unit lists of a pool's member IDs (see src/distribution/lists.rs), guarded by
-- the node marker. Every field is written once: its name is `<version>.<digest of payload>`.
--
-- KEYS[1]  the node marker (rq:marker), see id_propose.lua.
-- KEYS[2..] list hashes (rq:plist:<pool len>:<pool>:<id>).
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  mode:
--          "w"  write: then triples (i, field, payload): field of KEYS[i] set to payload if the
--               node lacks it; a field that holds another payload is an error (never changed).
--          "p"  prune: ARGV[3..] one floor per list hash, in KEYS order (KEYS[2] first): the
--               fields whose version (the decimal before the dot) is below it are deleted.
--
-- Returns  the number of fields written or deleted; -1 when the marker check failed (nothing
--          changed). An error reply for malformed arguments or a field holding another payload.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local n = 0
if ARGV[2] == 'w' then
  for i = 3, #ARGV - 2, 3 do
    local k = KEYS[tonumber(ARGV[i])]
    if not k or k == KEYS[1] then
      return redis.error_reply('ERR rq plist: bad key index')
    end
    local cur = redis.call('HGET', k, ARGV[i + 1])
    if not cur then
      redis.call('HSET', k, ARGV[i + 1], ARGV[i + 2])
      n = n + 1
    elseif cur ~= ARGV[i + 2] then
      return redis.error_reply('ERR rq plist: field ' .. ARGV[i + 1] .. ' holds another list')
    end
  end
elseif ARGV[2] == 'p' then
  for i = 2, #KEYS do
    local floor = rq_arg(ARGV[i + 1], 'list floor')
    for _, f in ipairs(redis.call('HKEYS', KEYS[i])) do
      local v = tonumber(string.match(f, '^(%d+)%.'))
      if v and v < floor then
        redis.call('HDEL', KEYS[i], f)
        n = n + 1
      end
    end
  end
else
  return redis.error_reply('ERR rq plist: bad mode')
end
return n
