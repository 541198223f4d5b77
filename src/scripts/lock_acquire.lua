-- lock_acquire.lua: grant a lease AND mint its fencing token, in one atomic step per node, only
-- if the lock key is exactly in the state the caller expects (compare-and-swap). No key here
-- ever expires on the server's clock: a node's wall clock may step at any time.
--
-- KEYS[1]  lock key (rq:lock:<name>): a hash {v = holder value, n = version, t = ttl ms, and
--          p = the fence key's value before this grant (0: none) on a copy this script
--          granted}, or absent when nobody holds the lease on this node. No TTL (see ARGV[8]).
--          A copy re-created by lock_extend.lua or restored by restore.lua has no p: only the
--          undo of the round that granted it here may roll a grant back (lock_release.lua's
--          mode "undo"), and only while p is there.
-- KEYS[2]  fence key (rq:fence:<name>): the highest token granted with this lock, a decimal
--          integer string, no TTL (one per lock name).
-- KEYS[3]  node marker (rq:marker), see id_propose.lua.
-- KEYS[4]  the lock's fence floor bucket (rq:floor:<bucket>): at least every fence of this
--          bucket's locks that this node collected (see lock_release.lua); a lock without a
--          fence key counts from it.
-- KEYS[5]  the earlier release's single fence floor (rq:floor): no longer written, still
--          counted.
-- ARGV[1]  value: the acquisition's random value (32 hex digits, 128 bits from the OS CSPRNG),
--          ':', the token, ':', optional holder information.
-- ARGV[2]  ttl in milliseconds, integer >= 1 (stored in the key so that watchers use the
--          holder's lease time, not their own).
-- ARGV[3]  proposed token, integer, 1 <= token < 2^53.
-- ARGV[4]  expected marker: the run_id of the incarnation the caller watched (or saw at
--          connect), or "*" to skip (test-only).
-- ARGV[5]  mode: "absent" (grant only if there is no key), "swap" (grant only if the key holds
--          exactly ARGV[6] at version ARGV[7]: a takeover after the caller watched that state
--          unchanged for its lease time), or "read" (change nothing, report the state).
-- ARGV[6]  expected value (mode "swap"), else "".
-- ARGV[7]  expected version (mode "swap"), else "0".
-- ARGV[8]  "x": ALSO set a server-side expiry of ttl ms on the key (TEST-ONLY switch that
--          restores the unsafe Redlock behaviour, so tests can show what it breaks); "" else.
--
-- Returns  {status, fence, value, version, ttl} where value/version/ttl describe the key as it
--          was before this call ("" / 0 / 0 when absent) and status is
--            1   granted: the key now holds ARGV[1] at version 1, the fence holds the token
--                (which was above fence);
--            0   not granted: the key is not in the expected state (or mode "read");
--           -2   the key is as expected but fence >= token: propose above fence;
--           -1   marker missing or stale: the node may not vote; nothing changed.
-- A node grants only when the key is as expected AND its fence is below the token, so a token
-- granted by a majority is above every token granted by a majority before it, unless that
-- earlier round was rolled back (lock_release.lua's mode "undo": only a round no caller was
-- given is; src/lock/mod.rs states what is guaranteed).
local ttl = rq_arg(ARGV[2], 'lock_acquire ttl')
local token = rq_arg(ARGV[3], 'lock_acquire token')
local expected_version = rq_arg(ARGV[7], 'lock_acquire expected version')
if ttl < 1 or token < 1 then
  return redis.error_reply('ERR rq lock_acquire: bad ttl or token')
end
-- One GET per register: a GET of a key of another type raises WRONGTYPE, so a corrupted fence
-- or floor is an error on this node, never read as 0. (One MGET of the four, with an EXISTS
-- to tell an absent register from a wrong-typed one, measured no cheaper inside Redis.)
local fence_key = redis.call('GET', KEYS[2])
local fence = math.max(rq_stored(fence_key, KEYS[2]),
  rq_stored(redis.call('GET', KEYS[4]), KEYS[4]), rq_stored(redis.call('GET', KEYS[5]), KEYS[5]))
local cur = redis.call('HMGET', KEYS[1], 'v', 'n', 't')
local value = cur[1] or ''
local version = rq_stored(cur[2], KEYS[1] .. ' n')
local cur_ttl = rq_stored(cur[3], KEYS[1] .. ' t')
if ARGV[4] ~= '*' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return {-1, fence, value, version, cur_ttl}
end
local mode = ARGV[5]
local expected
if mode == 'absent' then
  expected = (cur[1] == false)
elseif mode == 'swap' then
  expected = (cur[1] ~= false and value == ARGV[6] and version == expected_version)
else
  expected = false
end
if not expected then
  return {0, fence, value, version, cur_ttl}
end
if fence >= token then
  return {-2, fence, value, version, cur_ttl}
end
-- The fence first, then the lease: a lease copy's token is never above its node's fence, even
-- when the lease's write is refused after the fence's (an operator's ACL change mid-script;
-- Redis undoes no earlier write). A lease key holds only v, n, t and (written here only) p:
-- HSET replaces a swapped lease whole, with no DEL before it. p keeps the fence key's own
-- digits (0 when there was none), for the round's undo to set it back to.
redis.call('SET', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'n', '1', 't', ARGV[2], 'p', fence_key or '0')
if ARGV[8] == 'x' then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, fence, value, version, cur_ttl}
