-- view_write.lua: the group view register. A view is stored only as a compare-and-set on the
-- version it was derived from, so views form one chain and one version names one view.
--
-- KEYS[1]  the group's view (rq:view:<group>): a hash with fields `token` (decimal integer
--          below 2^53, the view version as a token), `view` (the view, JSON) and `hash` (the
--          view's digest, 16 hex digits).
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  the view's token, decimal integer, 1 <= token < 2^53.
-- ARGV[2]  the view, JSON.
-- ARGV[3]  the view's digest.
-- ARGV[4]  the token of the version the view was derived from (its base), decimal integer
--          below ARGV[1]; or "-": the TEST-ONLY forkable register (set-if-greater, an equal
--          token counts as held whatever its content).
-- KEYS[3]  (repair only) the repair claim (rq:repairing).
-- ARGV[5]  expected marker; or "claim:<nonce>" (repair, which writes before marking: the node
--          must carry that repairer's claim in KEYS[3] instead); or "*" (test-only).
--
-- Returns  {1, previous}  stored (the node held the base or an older version), or already
--                         held (equal token and digest): the node now holds exactly this view.
--          {0, current}   the node holds a newer view, or another view derived from the same
--                         base or a later one (current > base): nothing changed.
--          {-2, current}  the node holds another view at this very version: a fork refused.
--          {-1, current}  marker missing or stale: the node may not vote (or, for a repair,
--                         the claim is not the repairer's).
--          An error reply for malformed arguments or a corrupted register.
local token = rq_int(ARGV[1])
if not token or token < 1 then
  return redis.error_reply('ERR rq view_write: bad token')
end
local current = rq_stored(redis.call('HGET', KEYS[1], 'token'), KEYS[1] .. ' token')
if string.sub(ARGV[5], 1, 6) == 'claim:' then
  if not rq_claimed(KEYS[3], string.sub(ARGV[5], 7)) then
    return {-1, current}
  end
elseif ARGV[5] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[5] then
  return {-1, current}
end
if ARGV[4] == '-' then
  if token > current then
    redis.call('HSET', KEYS[1], 'token', ARGV[1], 'view', ARGV[2], 'hash', ARGV[3])
  end
  if token >= current then
    return {1, current}
  end
  return {0, current}
end
local base = rq_int(ARGV[4])
if not base or base >= token then
  return redis.error_reply('ERR rq view_write: bad base')
end
if token == current then
  if redis.call('HGET', KEYS[1], 'hash') == ARGV[3] then
    return {1, current}
  end
  return {-2, current}
end
if current <= base then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'view', ARGV[2], 'hash', ARGV[3])
  return {1, current}
end
return {0, current}
