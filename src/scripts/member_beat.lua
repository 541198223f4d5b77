-- member_beat.lua: refresh (or drop) one member's membership lease in a group.
--
-- KEYS[1]  the group's members (rq:members:<group>): a sorted set, member ID -> expiry in
--          milliseconds of THIS node's clock (TIME).
-- ARGV[1]  member ID.
-- ARGV[2]  lease time in milliseconds, integer >= 1.
-- ARGV[3]  "1" to leave (remove the member), "0" to refresh.
--
-- Returns  1 (refreshed or removed). Expired members are removed on the way.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
return 1
