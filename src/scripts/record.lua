-- record.lua: raise one field of a hash of integers (completion records of periodic jobs:
-- period -> token, and their begin marks; acknowledgements of prepared views: member -> view
-- token), guarded by the node marker; a job's record or begin mark also by the job's lease.
--
-- KEYS[1]  the hash (rq:done:<job> or rq:ack:<group>).
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- A job's record or begin mark (six keys) adds the job's lease, see lock_acquire.lua:
-- KEYS[3]  the job's lock key (rq:lock:<job>).
-- KEYS[4]  its fence key (rq:fence:<job>).
-- KEYS[5]  its fence floor bucket (rq:floor:<bucket>).
-- KEYS[6]  the earlier release's single fence floor (rq:floor).
-- ARGV[1]  the field.
-- ARGV[2]  the value, a decimal integer below 2^53 (a job's: the run's fencing token).
-- ARGV[3]  expected marker, or "*" (test-only).
-- With two keys (an acknowledgement):
-- ARGV[4]  optional: a companion field, set to ARGV[5] as it is (an acknowledgement's
--          "<token>:<view digest>", naming the content it acknowledges).
-- With six keys (a job):
-- ARGV[4]  the holder's lease value (as passed to lock_acquire.lua).
-- ARGV[5]  the period's begin mark field (in KEYS[1]).
-- ARGV[6]  "" to check the lease, or "*" to skip that check (TEST-ONLY: a late record lands).
--
-- Returns  {1, previous}  the field now holds at least ARGV[2] (never lowered).
--          {-1, current}  marker missing or stale: nothing changed.
--          {-2, above}    a job's only: nothing changed, because this node shows a later
--                         holder or run, `above` being the highest of what it found above the
--                         token: the lock's fence key; the floors when the node holds no copy
--                         of the holder's lease (other locks share a bucket: they matter only
--                         where the copy is missing, as for lock_extend.lua's re-creation);
--                         the period's begin mark (a later run began the period).
--          An error reply for a malformed value or a corrupted field.
local want = rq_arg(ARGV[2], 'record value')
local current = rq_stored(redis.call('HGET', KEYS[1], ARGV[1]), KEYS[1] .. ' ' .. ARGV[1])
if ARGV[3] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return {-1, current}
end
if #KEYS == 6 then
  if ARGV[6] ~= '*' then
    local above = math.max(rq_stored(redis.call('GET', KEYS[4]), KEYS[4]),
      rq_stored(redis.call('HGET', KEYS[1], ARGV[5]), KEYS[1] .. ' ' .. ARGV[5]))
    if redis.call('HGET', KEYS[3], 'v') ~= ARGV[4] then
      above = math.max(above, rq_stored(redis.call('GET', KEYS[5]), KEYS[5]),
        rq_stored(redis.call('GET', KEYS[6]), KEYS[6]))
    end
    if above > want then
      return {-2, above}
    end
  end
elseif #KEYS ~= 2 then
  return redis.error_reply('ERR rq record: two keys (an acknowledgement) or six (a job)')
end
if current < want then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
if #KEYS == 2 and ARGV[4] and ARGV[5] then
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
end
return {1, current}
