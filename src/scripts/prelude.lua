-- prelude.lua: helpers prepended to every redquorum script at build time (src/scripts.rs).
--
-- rq_int(s)          a decimal integer given as digits only (no sign, exponent, space, "nan"
--                    or "inf"), below 2^53 (Lua numbers are doubles: above, comparisons lie);
--                    nil for anything else.
-- rq_arg(s, what)    rq_int for an argument; an error reply naming `what` when malformed.
-- rq_stored(v, what) a value read from the node: absent (false) is 0; a value that is not a
--                    valid integer is a corrupted register, raised as an error (never read
--                    as 0, which would let every stale write through).
local function rq_int(s)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
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
-- rq_absent(keys, vals) after an MGET of `keys` returned `vals`: MGET reads a key of another
--                    type as absent (GET raised WRONGTYPE); when any of them came back absent,
--                    one EXISTS tells a truly absent register from a wrong-typed one, which is
--                    raised as a corrupted register (never read as 0).
local function rq_absent(keys, vals)
  local missing = {}
  for i = 1, #keys do
    if not vals[i] then
      missing[#missing + 1] = keys[i]
    end
  end
  if #missing > 0 and redis.call('EXISTS', unpack(missing)) > 0 then
    error({err = 'ERR rq: corrupted register (a key of another type) among ' ..
      table.concat(missing, ' ')})
  end
end
