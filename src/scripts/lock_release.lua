-- lock_release.lua: compare-and-delete.
--
-- KEYS[1]  lock key (rq:lock:<name>), see lock_acquire.lua.
-- ARGV[1]  the holder's value.
-- ARGV[2]  pub/sub channel to notify waiters on (rq:released:<name>).
--
-- Returns  1 if the key held ARGV[1] and was deleted (waiters are notified); 0 otherwise
--          (someone else's lock is never touched).
if redis.call('HGET', KEYS[1], 'v') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
