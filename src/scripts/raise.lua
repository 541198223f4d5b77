-- raise.lua: repair step. Raise monotonic registers on a node to at least the given values.
--
-- KEYS[1..n]  monotonic register keys (rq:id:<name>, ...), decimal integer strings.
-- ARGV[1..n]  the value to raise KEYS[i] to, an integer below 2^53.
--
-- Returns     the number of keys that were raised (the others already held as much or more).
--             Never lowers a value.
local raised = 0
for i, key in ipairs(KEYS) do
  local want = rq_arg(ARGV[i], 'raise value')
  local current = rq_stored(redis.call('GET', key), key)
  if current < want then
    redis.call('SET', key, ARGV[i])
    raised = raised + 1
  end
end
return raised
