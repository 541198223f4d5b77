-- raise.lua: repair step. Raise monotonic registers on a node to at least the given values.
--
-- KEYS[1..n]  monotonic register keys (rq:id:<name>, ...), decimal integer strings.
-- ARGV[1..n]  the value to raise KEYS[i] to, an integer below 2^53.
--
-- Returns     the number of keys that were raised (the others already held as much or more).
--             Never lowers a value.
local raised = 0
for i, key in ipairs(KEYS) do
  local want = tonumber(ARGV[i])
  if not want or want < 0 or want >= 9007199254740992 then
    return redis.error_reply('ERR rq raise: bad value for key ' .. i)
  end
  local current = tonumber(redis.call('GET', key) or '0') or 0
  if current < want then
    redis.call('SET', key, ARGV[i])
    raised = raised + 1
  end
end
return raised
