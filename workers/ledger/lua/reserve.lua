-- reserve.lua: charge one release of a budget scope atomically, or return its stored payload.
--
-- KEYS[1] config   hash    dpstream:{S}:config     cap, reserve, warn (units); must exist
-- KEYS[2] breaker  hash    dpstream:{S}:breaker    manual / auto_period open flags
-- KEYS[3] period   hash    dpstream:{S}:period:P   spent, granted, refused, grant, cap, reserve, start
-- KEYS[4] release  hash    dpstream:{S}:release:R  state, cost, payload, ratio_after, ...
-- KEYS[5] ends     zset    dpstream:{S}:period:P:ends:M   charged releases of M, scored by window end
-- KEYS[6] audit    stream  dpstream:{S}:audit
-- KEYS[7] pending  zset    dpstream:{S}:pending    reserved, not yet published (score: reserve ms)
-- KEYS[8] periods  zset    dpstream:{S}:periods    period ids (score: period start s)
-- ARGV: [1] release_id [2] period_id [3] period_start_s [4] metric [5] window_start [6] window_end
--       [7] cost_units (integer > 0) [8] may_use_reserve 0|1 [9] now_ms [10] retention_s
--       [11] payload bytes [12] actor
-- Returns {outcome, payload, reason, spent_after, cap, state, cost_units}
--   outcome: 'granted' | 'duplicate' | 'refused'; payload: the stored final bytes ('' if refused).
-- Invariants: everything is validated before the first write; a refusal charges and stores
-- nothing (it only counts and audits itself, and opens the breaker when the release cannot fit
-- the whole cap); spent <= cap always; a known release_id is never charged again.
-- The token "ratio_after":null in the payload is replaced by the ratio after this charge (%.6f).

local rid, pid, pstart, metric = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cost_s, may_use, now, actor = ARGV[7], ARGV[8], ARGV[9], ARGV[12]
local cost = tonumber(cost_s)
if not cost or cost <= 0 or cost ~= math.floor(cost) or cost > 9007199254740991 then
  return redis.error_reply('dpstream: reserve: bad cost_units ' .. tostring(cost_s))
end
if not tonumber(pstart) or not tonumber(ARGV[6]) or not tonumber(ARGV[10]) then
  return redis.error_reply('dpstream: reserve: bad period_start, window_end or retention')
end

local cfg = redis.call('HMGET', KEYS[1], 'cap', 'reserve', 'warn')
if not cfg[1] then
  return redis.error_reply('dpstream: reserve: scope not registered (' .. KEYS[1] .. ')')
end
local cap, reserve, warn = tonumber(cfg[1]), tonumber(cfg[2]), tonumber(cfg[3])
local br = redis.call('HMGET', KEYS[2], 'manual', 'manual_reason', 'auto_period', 'auto_start', 'auto_reason')
local per = redis.call('HMGET', KEYS[3], 'spent', 'grant')
local spent = tonumber(per[1] or '0')
local grant = tonumber(per[2] or '0')
local manual = br[1] == '1'
local auto_here = br[3] == pid
local auto_stale = br[3] and not auto_here and tonumber(br[4]) < tonumber(pstart)

local function state_of(s, open)
  if open then return 'open' end
  if s >= warn then return 'warning' end
  return 'normal'
end
local function ratio_of(s) return string.format('%.6f', s / cap) end

-- 1. a known release_id: the first stored bytes, nothing charged
local known = redis.call('HMGET', KEYS[4], 'payload')
if known[1] then
  return {'duplicate', known[1], '', spent, cap, state_of(spent, manual or auto_here), 0}
end

local function audit(kind, fields)
  local entry = {'kind', kind, 'period', pid, 'release_id', '', 'metric', '', 'cost', '', 'spent', string.format('%d', spent),
                 'ratio', ratio_of(spent), 'state', '', 'reason', '', 'actor', actor}
  for i = 1, #fields, 2 do
    for j = 1, #entry, 2 do
      if entry[j] == fields[i] then entry[j + 1] = fields[i + 1] end
    end
  end
  redis.call('XADD', KEYS[6], '*', unpack(entry))
end
local function touch_period()
  redis.call('HSET', KEYS[3], 'cap', cfg[1], 'reserve', cfg[2], 'start', pstart)
  if redis.call('ZADD', KEYS[8], 'NX', pstart, pid) == 1 then
    audit('period', {'reason', 'period block opened', 'actor', 'ledger', 'state', state_of(spent, manual)})
  end
end

-- 2. rollover: an automatic open of an earlier period closes with this one
if auto_stale then
  redis.call('HDEL', KEYS[2], 'auto_period', 'auto_start', 'auto_reason', 'auto_at')
  audit('breaker_close', {'reason', 'period rollover: automatic open of ' .. br[3] .. ' ends', 'actor', 'ledger',
                          'state', state_of(spent, manual)})
end

local function refuse(reason, open_now)
  touch_period()
  redis.call('HINCRBY', KEYS[3], 'refused', 1)
  local open = manual or auto_here or open_now
  audit('refusal', {'release_id', rid, 'metric', metric, 'cost', cost_s, 'reason', reason,
                    'state', state_of(spent, open)})
  if open_now and not (manual or auto_here) then
    redis.call('HSET', KEYS[2], 'auto_period', pid, 'auto_start', pstart, 'auto_reason', reason, 'auto_at', now)
    audit('breaker_open', {'reason', reason, 'actor', 'ledger', 'state', 'open'})
  end
  return {'refused', '', reason, spent, cap, state_of(spent, open), 0}
end

-- 3. checks (no write above this line except the rollover close and refusal bookkeeping)
if manual then return refuse('breaker open (manual): ' .. (br[2] or ''), false) end
if auto_here then return refuse('breaker open (automatic): ' .. (br[5] or ''), false) end
if spent + cost > cap then
  return refuse('budget exhausted: cost ' .. cost_s .. ' exceeds the ' .. string.format('%d', cap - spent) .. ' units left of the cap', true)
end
local limit = cap - reserve + grant
if may_use == '1' or limit > cap then limit = cap end
if spent + cost > limit then
  return refuse('pool exhausted: cost ' .. cost_s .. ' exceeds the ' .. string.format('%d', math.max(0, limit - spent)) ..
                ' units left outside the reserve (only may_use_reserve metrics or an operator grant draw on it)', false)
end

-- 4. charge, store the final payload, audit
local before = state_of(spent, false)
touch_period()
local after_spent = redis.call('HINCRBY', KEYS[3], 'spent', cost_s)
redis.call('HINCRBY', KEYS[3], 'granted', 1)
local ratio = string.format('%.6f', after_spent / cap)
local payload = ARGV[11]
local i, j = string.find(payload, '"ratio_after":null', 1, true)
if i then payload = string.sub(payload, 1, i - 1) .. '"ratio_after":' .. ratio .. string.sub(payload, j + 1) end
redis.call('HSET', KEYS[4], 'state', 'reserved', 'period', pid, 'metric', metric, 'window_start', ARGV[5],
           'window_end', ARGV[6], 'cost', cost_s, 'payload', payload, 'ratio_after', ratio, 'reserved_at', now)
redis.call('EXPIRE', KEYS[4], ARGV[10])
redis.call('ZADD', KEYS[5], ARGV[6], rid)
redis.call('EXPIRE', KEYS[5], ARGV[10])
redis.call('ZADD', KEYS[7], now, rid)
spent = after_spent
local after = state_of(after_spent, false)
audit('charge', {'release_id', rid, 'metric', metric, 'cost', cost_s, 'state', after})
if after ~= before then
  audit('state', {'reason', before .. ' -> ' .. after .. ' at ratio ' .. ratio, 'actor', 'ledger', 'state', after})
end
return {'granted', payload, '', after_spent, cap, after, cost}
