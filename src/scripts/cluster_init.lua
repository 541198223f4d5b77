-- cluster_init.lua: `cluster init` on a cluster set up already: raise a marked node's
-- descriptor (its node timeout), compare-and-set. (Blank nodes are marked by mark.lua, under
-- the set-up's repair claims.)
--
-- KEYS[1]  the node marker (rq:marker).
-- KEYS[2]  the cluster descriptor (rq:cluster), see src/cluster.rs.
-- ARGV[1]  the raised descriptor (JSON).
-- ARGV[2]  the descriptor the node must hold now.
--
-- Returns  1  raised: the node holds ARGV[1].
--          0  nothing changed: no marker, or another descriptor.
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('SET', KEYS[2], ARGV[1])
  return 1
end
return 0
