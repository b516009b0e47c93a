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
-- ARGV[1] header: newline-separated release_id, period_id, period_start_s, metric, window_start,
--         window_end, cost_units (integer > 0), may_use_reserve 0|1, now_ms, retention_s, actor
-- ARGV[2] payload bytes
-- Returns one bulk string: outcome \n spent_after \n cap \n state \n cost_units \n rest
--   outcome: 'granted' | 'duplicate' | 'refused'; rest: the stored final payload (granted,
--   duplicate) or the reason (refused). One string keeps the reply cheap to parse.
-- Invariants: everything is validated before the first write; a refusal charges and stores
-- nothing (it only counts and audits itself, and opens the breaker when the release cannot fit
-- the whole cap); spent <= cap always; a known release_id is never charged again.
-- The token "ratio_after":null in the payload is replaced by the ratio after this charge (%.6f).

local h = {}
for field in string.gmatch(ARGV[1], '[^\n]+') do h[#h + 1] = field end
if #h ~= 11 then return redis.error_reply('dpstream: reserve: header needs 11 fields, got ' .. #h) end
local rid, pid, pstart, metric, wstart, wend = h[1], h[2], h[3], h[4], h[5], h[6]
local cost_s, may_use, now, retention, actor = h[7], h[8], h[9], h[10], h[11]
local cost = tonumber(cost_s)
if not cost or cost <= 0 or cost ~= math.floor(cost) or cost > 9007199254740991 then
  return redis.error_reply('dpstream: reserve: bad cost_units ' .. tostring(cost_s))
end
if not tonumber(pstart) or not tonumber(wend) or not tonumber(retention) then
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
local function reply(outcome, s, state, charged, rest)
  return outcome .. '\n' .. string.format('%d', s) .. '\n' .. cfg[1] .. '\n' .. state .. '\n' ..
         string.format('%d', charged) .. '\n' .. rest
end

-- 1. a known release_id: the first stored bytes, nothing charged
local known = redis.call('HMGET', KEYS[4], 'payload')
if known[1] then
  return reply('duplicate', spent, state_of(spent, manual or auto_here), 0, known[1])
end

local function audit(kind, fields)
  -- empty fields are left out of the entry (readers default them to '')
  local entry = {'kind', kind, 'period', pid, 'spent', string.format('%d', spent), 'ratio', ratio_of(spent),
                 'actor', actor}
  for i = 1, #fields, 2 do
    local replaced = false
    for j = 1, #entry, 2 do
      if entry[j] == fields[i] then entry[j + 1] = fields[i + 1]; replaced = true end
    end
    if not replaced and fields[i + 1] ~= '' then
      entry[#entry + 1] = fields[i]
      entry[#entry + 1] = fields[i + 1]
    end
  end
  redis.call('XADD', KEYS[6], '*', unpack(entry))
end
local function touch_period()
  -- a new period block records the cap and reserve it starts with
  if redis.call('ZADD', KEYS[8], 'NX', pstart, pid) == 1 then
    redis.call('HSET', KEYS[3], 'cap', cfg[1], 'reserve', cfg[2], 'start', pstart)
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
  return reply('refused', spent, state_of(spent, open), 0, reason)
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
local payload = ARGV[2]
local i, j = string.find(payload, '"ratio_after":null', 1, true)
if i then payload = string.sub(payload, 1, i - 1) .. '"ratio_after":' .. ratio .. string.sub(payload, j + 1) end
redis.call('HSET', KEYS[4], 'state', 'reserved', 'period', pid, 'metric', metric, 'window_start', wstart,
           'window_end', wend, 'cost', cost_s, 'payload', payload, 'ratio_after', ratio, 'reserved_at', now)
redis.call('EXPIRE', KEYS[4], retention)
redis.call('ZADD', KEYS[5], wend, rid)
redis.call('EXPIRE', KEYS[5], retention)
redis.call('ZADD', KEYS[7], now, rid)
spent = after_spent
local after = state_of(after_spent, false)
audit('charge', {'release_id', rid, 'metric', metric, 'cost', cost_s, 'state', after})
if after ~= before then
  audit('state', {'reason', before .. ' -> ' .. after .. ' at ratio ' .. ratio, 'actor', 'ledger', 'state', after})
end
return reply('granted', after_spent, after, cost, payload)
