-- raise.lua: repair step. Raise monotonic registers on a node to at least the given values,
-- only while the node carries the repairer's claim (a repairer that lost its claim, or a node
-- emptied by FLUSHALL since the copy began, takes nothing).
--
-- KEYS[1]     the repair claim (rq:repairing).
-- KEYS[2..n]  monotonic register keys (rq:id:<name>, ...), decimal integer strings.
-- ARGV[1]     the repairer's claim nonce.
-- ARGV[2..n]  the value to raise KEYS[i] to, an integer below 2^53.
--
-- Returns     the number of keys that were raised (the others already held as much or more);
--             -1 when the claim is not the repairer's (nothing changed). Never lowers a value.
if not rq_claimed(KEYS[1], ARGV[1]) then
  return -1
end
local raised = 0
for i = 2, #KEYS do
  local key = KEYS[i]
  local want = rq_arg(ARGV[i], 'raise value')
  local current = rq_stored(redis.call('GET', key), key)
  if current < want then
    redis.call('SET', key, ARGV[i])
    raised = raised + 1
  end
end
return raised
