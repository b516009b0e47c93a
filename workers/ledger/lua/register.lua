-- register.lua: store a scope's config; a changed config is audited with its old and new digest.
--
-- KEYS[1] config  hash    dpstream:{S}:config
-- KEYS[2] audit   stream  dpstream:{S}:audit
-- KEYS[3] period  hash    dpstream:{S}:period:P  the current wall-clock period's block, P computed
--                                                with the stored period length (ARGV[4])
-- KEYS[4] periods zset    dpstream:{S}:periods   period ids (score: period start s)
-- ARGV: [1] digest [2] actor [3] now_ms [4] period_s that named KEYS[3] [5..] field, value pairs
--       (including 'digest', 'cap', 'accounting', 'period_s')
-- Returns {1} when the config was new or changed (and audited), {0} when unchanged,
--   {-1} when the stored period length is not ARGV[4] (read again and retry),
--   {2, what, block accounting, block cap, stored period_s} when refused ('accounting', 'cap'
--   or 'period'): nothing written.
-- Invariants: the newest registration wins for future periods; an open period block keeps the
-- terms it opened with, so a change of accounting or period length, or a smaller cap, is
-- refused while the current period's block exists (a larger cap, reserve or warn is stored
-- and applies from the next period); a change of period length is refused too while any block
-- starts inside the current period of the new length (hourly -> daily at 10:00 would open a
-- daily block over ten hourly ones). A charge is refused whatever slips past (a block that
-- overlaps another of another length, terms that are not the caller's: ledger.decision).
-- A stored change bumps the config's `seq` and clears its `writer`: a charge decided before it
-- is stale (apply.lua).

local old = redis.call('HGET', KEYS[1], 'digest')
if old == ARGV[1] then return {0} end
local new = {}
for i = 5, #ARGV, 2 do new[ARGV[i]] = ARGV[i + 1] end
if old then
  local stored = redis.call('HMGET', KEYS[1], 'period_s', 'accounting', 'cap')
  if stored[1] ~= ARGV[4] then return {-1} end
  local blk = redis.call('HMGET', KEYS[3], 'cap', 'accounting')
  if blk[1] then
    local acc = blk[2] or stored[2] or ''
    if new['accounting'] ~= acc then return {2, 'accounting', acc, blk[1], stored[1]} end
    if tonumber(new['cap']) < tonumber(blk[1]) then return {2, 'cap', acc, blk[1], stored[1]} end
    if new['period_s'] ~= stored[1] then return {2, 'period', acc, blk[1], stored[1]} end
  end
  local len = tonumber(new['period_s'])
  if new['period_s'] ~= stored[1] and len and len > 0 then
    local now_s = math.floor(tonumber(ARGV[3]) / 1000)
    local start = now_s - now_s % len
    local inside = redis.call('ZRANGEBYSCORE', KEYS[4], start, '(' .. string.format('%d', start + len), 'LIMIT', 0, 1)
    if inside[1] then return {2, 'period', stored[2] or '', stored[3], stored[1]} end
  end
end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HSET', KEYS[1], 'registered_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HDEL', KEYS[1], 'writer')
local reason = 'config registered ' .. ARGV[1]
if old then reason = 'config changed ' .. old .. ' -> ' .. ARGV[1] end
local cap = redis.call('HGET', KEYS[1], 'cap')
redis.call('XADD', KEYS[2], '*', 'kind', 'config', 'cost', cap,
           'reason', reason, 'actor', ARGV[2])
return {1}
