-- cluster_init.lua: bootstrap step. Mark a node that holds no marker for a new cluster.
--
-- KEYS[1]  the node marker (rq:marker).
-- KEYS[2]  the cluster descriptor (rq:cluster), see src/cluster.rs.
-- ARGV[1]  the marker to write: "<run_id>.<epoch>/<cluster id>" (a new epoch).
-- ARGV[2]  the cluster descriptor (JSON).
--
-- Returns  1  marked: the node now holds ARGV[1] and ARGV[2].
--          0  the node already holds a marker; nothing changed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 1
