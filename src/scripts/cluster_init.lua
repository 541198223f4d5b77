-- cluster_init.lua: `cluster init`. Mark a node that holds no marker for a new cluster; or,
-- with ARGV[3], raise a marked node's descriptor (its node timeout), compare-and-set.
--
-- KEYS[1]  the node marker (rq:marker).
-- KEYS[2]  the cluster descriptor (rq:cluster), see src/cluster.rs.
-- ARGV[1]  the marker to write: "<run_id>.<epoch>/<cluster id>" (a new epoch); unused with
--          ARGV[3].
-- ARGV[2]  the cluster descriptor (JSON).
-- ARGV[3]  (optional) raise: the descriptor the node must hold now. The node is never marked
--          in this mode.
--
-- Returns  1  marked (the node now holds ARGV[1] and ARGV[2]), or raised (it holds ARGV[2]).
--          0  nothing changed: marked already (mark), or not marked / another descriptor
--             (raise).
if ARGV[3] then
  if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('GET', KEYS[2]) == ARGV[3] then
    redis.call('SET', KEYS[2], ARGV[2])
    return 1
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 1
