-- prelude.lua: helpers prepended to every redquorum script at build time (src/scripts.rs).
--
-- rq_int(s)          a decimal integer given as digits only (no sign, exponent, space, "nan"
--                    or "inf"), below 2^53 (Lua numbers are doubles: above, comparisons lie);
--                    nil for anything else.
-- rq_arg(s, what)    rq_int for an argument; an error reply naming `what` when malformed.
-- rq_stored(v, what) a value read from the node: absent (false) is 0; a value that is not a
--                    valid integer is a corrupted register, raised as an error (never read
--                    as 0, which would let every stale write through).
local rq_type, rq_tonumber, rq_find = type, tonumber, string.find
local function rq_int(s)
  if rq_type(s) ~= 'string' or #s > 16 or not rq_find(s, '^%d+$') then
    return nil
  end
  local n = rq_tonumber(s)
  if not n or n >= 9007199254740992 then
    return nil
  end
  return n
end
local function rq_arg(s, what)
  local n = rq_int(s)
  if not n then
    error({err = 'ERR rq: bad ' .. what .. ': ' .. tostring(s)})
  end
  return n
end
local function rq_stored(v, what)
  if not v then
    return 0
  end
  local n = rq_int(v)
  if not n then
    error({err = 'ERR rq: corrupted register ' .. what .. ' (' .. tostring(v) .. ')'})
  end
  return n
end
-- rq_claimed(key, n) whether the repair claim at `key` is held by the repairer with nonce `n`
--                    (the claim's value is the nonce, or the nonce, ':' and a count); "*" is
--                    the TEST-ONLY unclaimed write.
local function rq_claimed(key, n)
  if n == '*' then
    return true
  end
  local c = redis.call('GET', key)
  return type(c) == 'string' and #n > 0 and (c == n or string.sub(c, 1, #n + 1) == n .. ':')
end
