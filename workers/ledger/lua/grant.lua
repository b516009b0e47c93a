-- grant.lua: an operator lets ordinary metrics draw `units` of the reserve in one period; audited.
--
-- KEYS[1] period   hash    dpstream:{S}:period:P
-- KEYS[2] breaker  hash    dpstream:{S}:breaker
-- KEYS[3] audit    stream  dpstream:{S}:audit
-- KEYS[4] config   hash    dpstream:{S}:config
-- KEYS[5] periods  zset    dpstream:{S}:periods
-- ARGV: [1] units (integer > 0) [2] reason (non-empty) [3] actor [4] now_ms [5] period id [6] period start
-- Returns {'granted', the period's total grant in units}, or, writing nothing, {'refused', left, spent,
-- cap, reserve not yet granted} when `units` is more than is left to grant: the reserve not yet
-- granted, and no more than the cap has left (a grant past either would widen nothing).
-- Invariant: the grant only widens the pool up to the period's cap; spend can never pass the cap.
-- It bumps the period's spend `version` (see charge.lua): a quote priced before it is stale.

local units = tonumber(ARGV[1])
if not units or units <= 0 or units ~= math.floor(units) then
  return redis.error_reply('dpstream: grant: bad units ' .. tostring(ARGV[1]))
end
if ARGV[2] == '' then return redis.error_reply('dpstream: grant: a reason is required') end
local cfg = redis.call('HMGET', KEYS[4], 'cap', 'reserve', 'warn', 'accounting', 'delta_cap', 'period_s')
if not cfg[1] then return redis.error_reply('dpstream: grant: scope not registered') end
-- what is left to grant: the block's own terms once opened, the config's before
local b = redis.call('HMGET', KEYS[1], 'cap', 'reserve', 'grant', 'spent')
local cap, reserve = tonumber(b[1] or cfg[1]), tonumber(b[2] or cfg[2])
local granted, spent = tonumber(b[3] or '0'), tonumber(b[4] or '0')
local ungranted = math.max(0, reserve - granted)
local left = math.max(0, math.min(ungranted, cap - spent))
if units > left then
  return {'refused', tostring(left), tostring(spent), tostring(cap), tostring(ungranted)}
end
-- a block opened here takes the config's terms, as charge.lua's would; an open block keeps its own
if redis.call('ZADD', KEYS[5], 'NX', ARGV[6], ARGV[5]) == 1 then
  redis.call('HSET', KEYS[1], 'cap', cfg[1], 'reserve', cfg[2], 'warn', cfg[3], 'accounting', cfg[4] or '',
             'delta_cap', cfg[5] or '0', 'start', ARGV[6])
  -- the block's own length, which every later charge checks against the caller's (charge.lua)
  if cfg[6] then redis.call('HSET', KEYS[1], 'period_s', cfg[6]) end
  redis.call('XADD', KEYS[3], '*', 'kind', 'period', 'period', ARGV[5], 'reason', 'period block opened',
             'actor', 'ledger')
end
local total = redis.call('HINCRBY', KEYS[1], 'grant', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('XADD', KEYS[3], '*', 'kind', 'grant', 'period', ARGV[5], 'cost', ARGV[1],
           'reason', ARGV[2], 'actor', ARGV[3])
if redis.call('HGET', KEYS[2], 'auto_period') == ARGV[5] then
  redis.call('HDEL', KEYS[2], 'auto_period', 'auto_start', 'auto_reason', 'auto_at')
  redis.call('XADD', KEYS[3], '*', 'kind', 'breaker_close', 'period', ARGV[5],
             'reason', 'reserve granted: ' .. ARGV[2], 'actor', ARGV[3])
end
return {'granted', tostring(total)}
