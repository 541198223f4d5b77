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
