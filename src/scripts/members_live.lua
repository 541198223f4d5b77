-- members_live.lua: the members whose lease has not expired on this node's clock.
--
-- KEYS[1]  the group's members (rq:members:<group>), see member_beat.lua.
--
-- Returns  an array of member IDs (read-only).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
