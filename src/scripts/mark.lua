-- mark.lua: the last step of a repair or of a change of the node list: store the cluster
-- descriptor, then the marker, only while the node still carries the repairer's claim (a
-- FLUSHALL during the copy removes the claim with the copied keys, so a half-copied node is
-- never marked).
--
-- KEYS[1]  the node marker (rq:marker).
-- KEYS[2]  the cluster descriptor (rq:cluster).
-- KEYS[3]  the repair claim (rq:repairing).
-- KEYS[4]  the node's last repair nonce (rq:marked): set to the claim nonce, so state derived
--          from the node's history since a repair (a pool's change log, units.lua) knows a copy
--          may have written keys without it.
-- ARGV[1]  the marker to write.
-- ARGV[2]  the descriptor to write; a stored descriptor of the same cluster id that records a
--          longer node timeout (`node_timeout_ms`) is kept instead: a mark never lowers the
--          cluster's node timeout (a raise may land between a repair's census and its mark).
-- ARGV[3]  the repairer's claim nonce: the claim must hold it (it is then deleted).
--
-- Returns  1 marked; 0 the claim is gone or another's: nothing changed.
if not rq_claimed(KEYS[3], ARGV[3]) then
  return 0
end
-- The claim is deleted first: a write refused after it (an operator's ACL change; Redis undoes
-- no earlier write of a script) leaves the node unmarked and unclaimed, so the next repair
-- claims and copies it again, instead of marked with a stale claim it must wait out.
redis.call('DEL', KEYS[3])
local stored = redis.call('GET', KEYS[2])
local keep = false
if type(stored) == 'string' then
  local ok_s, s = pcall(cjson.decode, stored)
  local ok_n, n = pcall(cjson.decode, ARGV[2])
  if ok_s and ok_n and type(s) == 'table' and type(n) == 'table' and s.id == n.id
      and type(s.node_timeout_ms) == 'number'
      and s.node_timeout_ms > (tonumber(n.node_timeout_ms) or 0) then
    keep = true
  end
end
if not keep then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[4], ARGV[3])
return 1
