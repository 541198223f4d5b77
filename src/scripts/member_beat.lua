-- member_beat.lua: refresh (or drop) one member's beat in a group. No node clock is read: the
-- group's leader judges a member gone on its own monotonic clock, from a beat value that
-- stayed unchanged on a majority for the lease time (see lease.rs).
--
-- KEYS[1]  the group's members (rq:members:<group>): a hash, member key -> beat sequence.
--          A member key is `<id>#<per-process nonce>`.
-- KEYS[2]  the node marker (rq:marker), see id_propose.lua.
-- ARGV[1]  member key.
-- ARGV[2]  beat sequence: a decimal integer the member raises with every beat (mode "0"); the
--          value the leader watched (mode "gc"); ignored when leaving.
-- ARGV[3]  "1" to leave: the entry becomes "left" (written by the member itself after it
--          stopped owning anything, so the leader may treat it as gone at once); "0" to
--          refresh; "gc" to remove the entry only if it still holds exactly ARGV[2] (the
--          leader cleaning up a member it judged gone).
-- ARGV[4]  expected marker, or "*" (test-only).
--
-- Returns  1 (refreshed, left or removed), 0 ("gc" found another value: the member beat
--          again), -1 (marker missing or stale: nothing changed).
if ARGV[4] ~= '*' and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  return -1
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], 'left')
elseif ARGV[3] == 'gc' then
  if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
    return 0
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
elseif ARGV[3] == '0' then
  rq_arg(ARGV[2], 'beat sequence')
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
else
  return redis.error_reply('ERR rq member_beat: bad mode')
end
return 1
