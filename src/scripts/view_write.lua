-- view_write.lua: the group view register: store a view only if its version token is higher.
--
-- KEYS[1]  the group's view (rq:view:<group>): a hash with fields `token` (decimal integer
--          below 2^53, the view version as a token) and `view` (the view, JSON).
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  the view's token.
-- ARGV[2]  the view, JSON.
-- ARGV[3]  expected marker, or "*" (test-only).
--
-- Returns  {1, previous}  stored (previous token was lower) or already held (equal token):
--                         the node now holds exactly this view.
--          {0, current}   the node holds a newer view (current > token); nothing changed.
--          {-1, current}  marker missing or stale: the node may not vote.
local token = tonumber(ARGV[1])
if not token or token < 0 or token >= 9007199254740992 then
  return redis.error_reply('ERR rq view_write: bad token')
end
local current = tonumber(redis.call('HGET', KEYS[1], 'token') or '0') or 0
if ARGV[3] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return {-1, current}
end
if token > current then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'view', ARGV[2])
  return {1, current}
end
if token == current then
  return {1, current}
end
return {0, current}
