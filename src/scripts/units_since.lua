-- units_since.lua: a pool leader's read of one node's unit register: only the fields raised
-- since the leader's last read of this node when its change log allows (a delta), else the
-- whole register. Guarded by the node marker. See units.lua for the keys' contents.
--
-- KEYS[1]  the pool's units (rq:units:<pool>).
-- KEYS[2]  the node marker (rq:marker).
-- KEYS[3]  the pool's change stamp (rq:ustamp:<pool>).
-- KEYS[4]  the pool's change log (rq:ulog:<pool>).
-- KEYS[5]  the log's epoch (rq:uepoch:<pool>).
-- KEYS[6]  the node's last repair nonce (rq:marked).
-- ARGV[1]  expected marker, or "*" (test-only).
-- ARGV[2]  the epoch id the reader last read this node under, or "" (none).
-- ARGV[3]  the stamp it read then (decimal integer), or "0".
-- ARGV[4]  a new epoch id (random), used if the log (re)starts here.
-- ARGV[5]  the stamp's start where missing: a random decimal integer below 2^40.
--
-- Returns  {1, id, stamp, since, field, entry, ...}  a delta: every field changed since
--                                 ARGV[3] (= since) under epoch ARGV[2] (every write since
--                                 logged it); a field collected since has the entry "".
--          {2, id, stamp, 0, field, entry, ...}  the whole register (the reader has no valid
--                                 cursor here, or the log restarted: a restart, a repair, a
--                                 write that did not log).
--          {-1}                   marker missing or stale: the node may not vote.
-- A reader whose cursor is (id, stamp) after a reply has seen every field of this node as of
-- that reply: the log holds every field raised under its epoch (units.lua), and a new epoch
-- is only ever handed out with the whole register.
if ARGV[1] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {-1}
end
local raw = redis.call('GET', KEYS[3])
if not raw then
  rq_arg(ARGV[5], 'stamp start')
  redis.call('SET', KEYS[3], ARGV[5])
  raw = ARGV[5]
end
local stamp = rq_stored(raw, KEYS[3])
local bind = ARGV[1] .. '|' .. (redis.call('GET', KEYS[6]) or '')
local ep = redis.call('HMGET', KEYS[5], 'id', 'bind', 'through')
local valid = ep[1] and ep[2] == bind and rq_int(ep[3]) == stamp
if valid and ep[1] == ARGV[2] then
  local since = rq_arg(ARGV[3], 'stamp')
  if since <= stamp then
    local out = {1, ep[1], stamp, since}
    if since < stamp then
      local fields = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. ARGV[3], '+inf')
      for _, f in ipairs(fields) do
        out[#out + 1] = f
        out[#out + 1] = redis.call('HGET', KEYS[1], f) or ''
      end
    end
    return out
  end
end
local id = ep[1]
if not valid then
  redis.call('DEL', KEYS[4])
  redis.call('HSET', KEYS[5], 'id', ARGV[4], 'bind', bind, 'through', string.format('%d', stamp))
  id = ARGV[4]
end
local out = {2, id, stamp, 0}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do
  out[#out + 1] = all[i]
end
return out
