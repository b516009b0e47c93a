-- apply.lua: make one charge's writes, decided in Python (ledger.decision), atomically, if the scope
-- still stands where it was decided; the ledger's invariants are enforced here whatever was decided.
--
-- KEYS[1] config   hash    dpstream:{S}:config    its `seq` counts every write a decision reads
--                                                 (charges, grants, breaker changes, registrations)
--                                                 and `writer` names the charge that wrote last
-- KEYS[2] release  hash    dpstream:{S}:release:R the release being charged
-- KEYS[3] turn     string  dpstream:{S}:turn      a process that others' writes kept stale holds
--                                                 the scope for a moment (SET NX PX): only its steps
--                                                 write, and its first write ends the turn
-- KEYS[4..]        the keys the ops and guards name, by index into KEYS
-- ARGV[1] seq and ARGV[2] writer the step was decided at ('0' and '' for a scope never written)
-- ARGV[3] this step's writer id '<process>.<n>' (unique per step), set as `writer` when it writes
-- ARGV[4] g: guards follow, 9 fields each: key index of a period block to charge, the units it
--         pays, delta units, the caller's accounting, cap units and period length (s), and under
--         `contribution.max_windows` m (else 0; -m for a running total's step after its period's
--         first), the block's field of the metric's largest charges and the release's cost (units)
-- ARGV[5 + 9g] the ops, one MessagePack array (absent: none), each op {command, key index,
--         {arguments}}; commands HSET, HINCRBY (field, by, ...), HDEL, ZADD, ZADDNX (the member must
--         be new), XADD, EXPIRE. One packed argument, not one per value: the client encodes each
--         argument of a call on its own, and a charge's ops hold about 80 values.
-- Returns {'duplicate', payload} for a known release id, {'stale', seq} when the scope moved since
-- the decision, each writing nothing, else {'ok', seq after}.
-- Invariants, checked before the first write: a known release id is never charged again; a step
-- decided on another state writes nothing; under max_windows a block pays what the release raises
-- the sum of the metric's m largest charges by, and a running total's later step is charged only
-- once its period's lump (its first step) is; in every charged block spent + paid <= cap and
-- delta_spent + delta <= delta_cap (its own terms once opened, else the config's); an opened
-- block keeps its accounting and period length and no larger cap than the caller's; a block is
-- opened once. All or nothing: one script, every write after every check.

local known = redis.call('HGET', KEYS[2], 'payload')
if known then return {'duplicate', known} end
local now = redis.call('HMGET', KEYS[1], 'seq', 'writer')
if (now[1] or '0') ~= ARGV[1] or (now[2] or '') ~= ARGV[2] then return {'stale', now[1] or '0'} end
local process = string.match(ARGV[3], '^[^.]*')
local turn = redis.call('GET', KEYS[3])
if turn and turn ~= process then return {'stale', now[1] or '0'} end

local function fail(what) return redis.error_reply('dpstream: apply: ' .. what) end
local g = tonumber(ARGV[4])
local at = 5
local cfg = redis.call('HMGET', KEYS[1], 'cap', 'delta_cap', 'accounting', 'period_s')
for _ = 1, g do
  local key = KEYS[tonumber(ARGV[at])]
  local cost, delta = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local acc, cap_in, plen = ARGV[at + 3], tonumber(ARGV[at + 4]), ARGV[at + 5]
  local m = tonumber(ARGV[at + 6])
  if m < 0 then  -- a running total's later step: its period's lump is one of the stored charges
    if not redis.call('HGET', key, ARGV[at + 7]) then return fail('running total step before its lump in ' .. key) end
    m = -m
  end
  if m > 0 then  -- the m largest charges before and after this one (stored largest first)
    local top, before, after = {}, 0, 0
    for v in string.gmatch(redis.call('HGET', key, ARGV[at + 7]) or '', '%d+') do top[#top + 1] = tonumber(v) end
    for i = 1, math.min(#top, m) do before = before + top[i] end
    top[#top + 1] = tonumber(ARGV[at + 8])
    table.sort(top, function(x, y) return x > y end)
    for i = 1, math.min(#top, m) do after = after + top[i] end
    if after - before ~= cost then return fail('charge is not what it raises the largest charges of ' .. key .. ' by') end
  end
  local b = redis.call('HMGET', key, 'spent', 'cap', 'delta_spent', 'delta_cap', 'accounting', 'period_s')
  local cap, dcap = tonumber(b[2] or cfg[1]), tonumber(b[4] or cfg[2] or '0')
  if tonumber(b[1] or '0') + cost > cap then return fail('overspend in ' .. key) end
  if tonumber(b[3] or '0') + delta > dcap then return fail('selection delta over its cap in ' .. key) end
  if b[2] and ((b[5] or cfg[3] or '') ~= acc or cap > cap_in or (b[6] or cfg[4] or '') ~= plen) then
    return fail('charge against the fixed terms of ' .. key)
  end
  at = at + 9
end

local COMMANDS = {HSET = true, HINCRBY = true, HDEL = true, ZADD = true, ZADDNX = true, XADD = true, EXPIRE = true}
local ops = {}
if at < #ARGV then return fail('arguments past the ops') end
for i, op in ipairs(ARGV[at] and cmsgpack.unpack(ARGV[at]) or {}) do
  local cmd, key, args = op[1], KEYS[tonumber(op[2])], op[3]
  if not COMMANDS[cmd] or not key or type(args) ~= 'table' then return fail('bad op ' .. i) end
  for _, v in ipairs(args) do
    if type(v) ~= 'string' then return fail('bad argument of op ' .. i) end
  end
  ops[#ops + 1] = {cmd, key, args}
end
for _, op in ipairs(ops) do  -- the one check that needs the op itself: a block opens once
  if op[1] == 'ZADDNX' and redis.call('ZSCORE', op[2], op[3][2]) then
    return fail('block ' .. op[3][2] .. ' is open already')
  end
end
if #ops == 0 then return {'ok', now[1] or '0'} end

for _, op in ipairs(ops) do
  local cmd, key, args = op[1], op[2], op[3]
  if cmd == 'XADD' then
    redis.call('XADD', key, '*', unpack(args))
  elseif cmd == 'HINCRBY' then  -- field, by, field, by, ...
    for i = 1, #args, 2 do redis.call('HINCRBY', key, args[i], args[i + 1]) end
  elseif cmd == 'ZADDNX' then
    redis.call('ZADD', key, 'NX', unpack(args))
  else
    redis.call(cmd, key, unpack(args))
  end
end
redis.call('HSET', KEYS[1], 'writer', ARGV[3])
if turn then redis.call('DEL', KEYS[3]) end
return {'ok', tostring(redis.call('HINCRBY', KEYS[1], 'seq', 1))}
