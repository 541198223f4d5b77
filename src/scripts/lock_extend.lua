-- lock_extend.lua: extend a lease this holder still has; never re-creates an expired key.
--
-- KEYS[1]  lock key (rq:lock:<name>).
-- ARGV[1]  the holder's value (as passed to lock_acquire.lua).
-- ARGV[2]  new ttl in milliseconds from now, integer >= 1.
--
-- Returns  1 if the key held ARGV[1] and its TTL was reset; 0 otherwise (expired, released,
--          or held by someone else); nothing changed then.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
