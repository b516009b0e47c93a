-- charge.lua: charge one release of a budget scope atomically, or return its stored payload.
--
-- KEYS[1] config   hash    dpstream:{S}:config     cap, reserve, warn (units), accounting, delta_cap, digest
-- KEYS[2] breaker  hash    dpstream:{S}:breaker    manual / auto_period open flags
-- KEYS[3] period   hash    dpstream:{S}:period:P   terms (cap, reserve, warn, accounting, delta_cap, start)
--                                                  and counters (spent, delta_spent, granted, refused, grant)
-- KEYS[4] release  hash    dpstream:{S}:release:R  state, cost, delta, payload, ratio_after, ...
-- KEYS[5] ends     zset    dpstream:{S}:period:P:ends:M   charged releases of M, scored by window end
-- KEYS[6] audit    stream  dpstream:{S}:audit
-- KEYS[7] pending  zset    dpstream:{S}:pending    reserved, not yet published (score: reserve ms)
-- KEYS[8] periods  zset    dpstream:{S}:periods    period ids (score: period start s)
-- KEYS[7+2k], KEYS[8+2k]   period and ends keys of the k-th later period the window touches
-- ARGV[1] header: newline-separated release_id, period_id, period_start_s, metric, window_start,
--         window_end, cost_units (integer > 0), may_use_reserve 0|1, now_ms, retention_s, actor,
--         config digest of the caller, delta_units (integer >= 0), the caller's terms: accounting,
--         cap_units (integer > 0), period_s (integer > 0), then expired 0|1 (1: the window is past
--         the ledger's idempotency horizon, as the caller reckons it), then period_id,
--         period_start_s of each later period
-- ARGV[2] payload bytes
-- ARGV[3] (optional, '' = no check) the main period's spend version the cost was quoted at
-- Returns one bulk string: outcome \n spent_after \n cap \n state \n cost_units \n rest
--   outcome: 'granted' | 'duplicate' | 'refused' | 'stale_quote' | 'expired'; rest: the stored final
--   payload (granted, duplicate), the reason (refused, expired) or the period's current version
--   (stale_quote).
--   One string keeps the reply cheap to parse. spent, cap and state are the main period's (on a
--   refusal: the refusing period's).
-- Invariants: everything is validated before the first write; a refusal charges and stores
-- nothing (it only counts and audits itself, and opens the breaker when the release cannot fit
-- the whole cap); spent <= cap and delta_spent <= delta_cap in every period; a known release_id
-- is never charged again; a straddling window is charged to every period it touches or to none.
-- A period's terms are copied from the config when its block opens (first charge or refusal)
-- and every check in that period uses the block's terms, never the (re-registered) config's.
-- A caller whose config digest differs from the registered one is refused (its topology
-- disagrees with the scope's registered terms). Whatever registered last, a caller is refused
-- when a block it would charge keeps another accounting or period length, or a larger cap than
-- the caller's (it would spend more per period than the caller's topology promises); and a block
-- not opened yet must not overlap an existing block of another length (its start lies inside the
-- new block, or the new block starts inside it). Such a refusal is counted and audited in the
-- conflicting block; no block is opened. Block lengths are read from each block's `period_s`
-- (the registered length for a block that does not record one); a neighbouring block's key is
-- KEYS[3] with its period id in place of P (same hash tag, so the same slot: the neighbour is
-- only known once the periods zset is read).
-- An expired window (header flag) is answered 'expired' after the known release_id check and
-- before anything else: nothing is charged, stored, counted or audited, no block is opened.
-- The token "ratio_after":null in the payload is replaced by the ratio after this charge (%.6f).
-- Spend version: every charge bumps the `version` field of each period block it charges, and an
-- automatic breaker open bumps the refusing period's (grant.lua bumps it too). A caller that
-- quoted the cost from the main period at version V passes V; if the block is no longer at V the
-- quote is stale (another process charged or granted since) and the call answers 'stale_quote'
-- before any write: the caller quotes again. So quote -> charge is exact across processes.

local MAX = 9007199254740991
local h = {}
for field in string.gmatch(ARGV[1], '[^\n]+') do h[#h + 1] = field end
if #h < 17 or (#h - 17) % 2 ~= 0 then
  return redis.error_reply('dpstream: charge: header needs 17 fields and 2 per later period, got ' .. #h)
end
local n_extra = (#h - 17) / 2
if #KEYS ~= 8 + 2 * n_extra then
  return redis.error_reply('dpstream: charge: ' .. #KEYS .. ' keys for ' .. n_extra .. ' later periods')
end
local rid, pid, pstart, metric, wstart, wend = h[1], h[2], h[3], h[4], h[5], h[6]
local cost_s, may_use, now, retention, actor = h[7], h[8], h[9], h[10], h[11]
local digest, delta_s = h[12], h[13]
local acc_in, cap_in_s, plen_s, expired = h[14], h[15], h[16], h[17]
local cost = tonumber(cost_s)
if not cost or cost <= 0 or cost ~= math.floor(cost) or cost > MAX then
  return redis.error_reply('dpstream: charge: bad cost_units ' .. tostring(cost_s))
end
local delta = tonumber(delta_s)
if not delta or delta < 0 or delta ~= math.floor(delta) or delta > MAX then
  return redis.error_reply('dpstream: charge: bad delta_units ' .. tostring(delta_s))
end
local quoted = ARGV[3] or ''
if quoted ~= '' and (not tonumber(quoted) or tonumber(quoted) < 0 or tonumber(quoted) ~= math.floor(tonumber(quoted))) then
  return redis.error_reply('dpstream: charge: bad quoted version ' .. quoted)
end
if not tonumber(pstart) or not tonumber(wend) or not tonumber(retention) then
  return redis.error_reply('dpstream: charge: bad period_start, window_end or retention')
end
local cap_in, plen = tonumber(cap_in_s), tonumber(plen_s)
if not cap_in or cap_in <= 0 or cap_in ~= math.floor(cap_in) or not plen or plen <= 0 or plen ~= math.floor(plen) then
  return redis.error_reply('dpstream: charge: bad caller cap_units or period_s ' .. cap_in_s .. ' ' .. plen_s)
end
if expired ~= '0' and expired ~= '1' then
  return redis.error_reply('dpstream: charge: bad expired flag ' .. expired)
end
if string.sub(KEYS[3], -#pid - 1) ~= ':' .. pid then
  return redis.error_reply('dpstream: charge: period key ' .. KEYS[3] .. ' does not name period ' .. pid)
end
local prefix = string.sub(KEYS[3], 1, #KEYS[3] - #pid)
for k = 1, n_extra do
  if not tonumber(h[17 + 2 * k]) then
    return redis.error_reply('dpstream: charge: bad start of later period ' .. tostring(h[16 + 2 * k]))
  end
end

local cfg = redis.call('HMGET', KEYS[1], 'cap', 'reserve', 'warn', 'accounting', 'delta_cap', 'digest', 'period_s')
if not cfg[1] then
  return redis.error_reply('dpstream: charge: scope not registered (' .. KEYS[1] .. ')')
end

-- every period the window touches: the main one first, then the later ones in time order
local P = {}
local function read_period(p_id, p_start, key, ends)
  local f = redis.call('HMGET', key, 'spent', 'grant', 'delta_spent', 'cap', 'reserve', 'warn', 'accounting',
                       'delta_cap', 'version', 'period_s')
  local p = {pid = p_id, pstart = p_start, key = key, ends = ends, version = f[9] or '0', opened = f[4] ~= false,
             cap_s = f[4] or cfg[1], reserve_s = f[5] or cfg[2], warn_s = f[6] or cfg[3],
             acc = f[7] or cfg[4] or '', dcap_s = f[8] or cfg[5] or '0', plen_s = f[10] or cfg[7] or ''}
  p.spent, p.grant, p.dspent = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
  p.cap, p.reserve, p.warn, p.dcap = tonumber(p.cap_s), tonumber(p.reserve_s), tonumber(p.warn_s), tonumber(p.dcap_s)
  return p
end
P[1] = read_period(pid, pstart, KEYS[3], KEYS[5])
for k = 1, n_extra do P[#P + 1] = read_period(h[16 + 2 * k], h[17 + 2 * k], KEYS[7 + 2 * k], KEYS[8 + 2 * k]) end
local main = P[1]

local br = redis.call('HMGET', KEYS[2], 'manual', 'manual_reason', 'auto_period', 'auto_start', 'auto_reason')
local manual = br[1] == '1'
local auto_here = br[3] == pid
local auto_touched = nil
for _, p in ipairs(P) do
  if br[3] == p.pid then auto_touched = p end
end
local auto_stale = br[3] and not auto_touched and tonumber(br[4]) < tonumber(pstart)

local function state_of(p, s, open)
  if open then return 'open' end
  if s >= p.warn then return 'warning' end
  return 'normal'
end
local function ratio_of(p, s) return string.format('%.6f', s / p.cap) end
local function reply(outcome, p, s, state, charged, rest)
  return outcome .. '\n' .. string.format('%d', s) .. '\n' .. p.cap_s .. '\n' .. state .. '\n' ..
         string.format('%d', charged) .. '\n' .. rest
end

-- 1. a known release_id: the first stored bytes, nothing charged
local known = redis.call('HMGET', KEYS[4], 'payload')
if known[1] then
  return reply('duplicate', main, main.spent, state_of(main, main.spent, manual or auto_here), 0, known[1])
end

-- 1a. past the idempotency horizon: never charged (nor noised) again, nothing written
if expired == '1' then
  return reply('expired', main, main.spent, state_of(main, main.spent, manual or auto_here), 0, 'expired')
end

-- 1b. a stale quote: the main period's spend moved since the caller priced this release; nothing
-- is written (no refusal counted or audited: nothing was decided), the caller quotes again
if quoted ~= '' and tonumber(main.version) ~= tonumber(quoted) then
  return reply('stale_quote', main, main.spent, state_of(main, main.spent, manual or auto_here), 0, main.version)
end

local function audit(p, kind, fields)
  -- empty fields are left out of the entry (readers default them to '')
  local entry = {'kind', kind, 'period', p.pid, 'spent', string.format('%d', p.spent), 'ratio',
                 ratio_of(p, p.spent), 'actor', actor}
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
local function touch_period(p)
  -- a new period block records the terms it keeps for its whole life
  if redis.call('ZADD', KEYS[8], 'NX', p.pstart, p.pid) == 1 then
    redis.call('HSET', p.key, 'cap', p.cap_s, 'reserve', p.reserve_s, 'warn', p.warn_s, 'accounting', p.acc,
               'delta_cap', p.dcap_s, 'start', p.pstart, 'period_s', plen_s)
    audit(p, 'period', {'reason', 'period block opened', 'actor', 'ledger', 'state', state_of(p, p.spent, manual)})
  end
end

-- 2. rollover: an automatic open of an earlier period closes with this one
if auto_stale then
  redis.call('HDEL', KEYS[2], 'auto_period', 'auto_start', 'auto_reason', 'auto_at')
  audit(main, 'breaker_close', {'reason', 'period rollover: automatic open of ' .. br[3] .. ' ends',
                                'actor', 'ledger', 'state', state_of(main, main.spent, manual)})
end

local function refuse(p, reason, open_now)
  touch_period(p)
  redis.call('HINCRBY', p.key, 'refused', 1)
  local open = manual or br[3] == p.pid or open_now
  audit(p, 'refusal', {'release_id', rid, 'metric', metric, 'cost', cost_s, 'delta', delta_s, 'reason', reason,
                       'state', state_of(p, p.spent, open)})
  if open_now then  -- only a budget refusal opens it, and it comes after both breaker checks
    redis.call('HSET', KEYS[2], 'auto_period', p.pid, 'auto_start', p.pstart, 'auto_reason', reason, 'auto_at', now)
    redis.call('HINCRBY', p.key, 'version', 1)
    audit(p, 'breaker_open', {'reason', reason, 'actor', 'ledger', 'state', 'open'})
  end
  return reply('refused', p, p.spent, state_of(p, p.spent, open), 0, reason)
end
local function where(p)
  if p == main then return '' end
  return ' (in later period ' .. p.pid .. ', which this window also touches)'
end

-- 3. checks (no write above this line except the rollover close and refusal bookkeeping)
if digest ~= cfg[6] then
  return refuse(main, "topology disagrees with the scope's registered terms (digest " .. (cfg[6] or '?') ..
                ', this worker ' .. digest .. '): restart it with the current topology', false)
end
-- a block's terms, fixed when it opened, against the caller's (whatever registered last)
local function conflict(p)
  if p.opened then
    local what = nil
    if p.acc ~= acc_in then
      what = 'accounting ' .. p.acc .. ', this worker ' .. acc_in
    elseif p.cap > cap_in then
      what = 'cap ' .. p.cap_s .. ' units, this worker ' .. cap_in_s .. ' (smaller)'
    elseif p.plen_s ~= plen_s then
      what = 'period ' .. p.plen_s .. ' s, this worker ' .. plen_s .. ' s'
    end
    if what then return p, what end
    return nil
  end
  -- not opened yet: it must not overlap a block of another length (one starting inside it, or
  -- the one it would start inside); blocks never overlap, so the nearest ones tell
  local start = tonumber(p.pstart)
  local b = redis.call('ZRANGEBYSCORE', KEYS[8], start, '(' .. string.format('%d', start + plen), 'WITHSCORES', 'LIMIT', 0, 1)
  if not b[1] then
    b = redis.call('ZREVRANGEBYSCORE', KEYS[8], '(' .. string.format('%d', start), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if b[1] then
      local len = redis.call('HGET', prefix .. b[1], 'period_s') or cfg[7]
      if tonumber(b[2]) + tonumber(len) <= start then b = {} end
    end
  end
  if b[1] and b[1] ~= p.pid then
    local q = read_period(b[1], b[2], prefix .. b[1], nil)
    return q, 'period ' .. q.plen_s .. ' s, this worker ' .. plen_s .. ' s, whose period ' .. p.pid .. ' overlaps it'
  end
  return nil
end
for _, p in ipairs(P) do
  local q, what = conflict(p)
  if q then
    return refuse(q, 'period terms differ: block ' .. q.pid .. ' keeps ' .. what .. ': a period keeps the terms ' ..
                  'it opened with; release its windows under those terms, or use a new scope name', false)
  end
end
if manual then return refuse(main, 'breaker open (manual): ' .. (br[2] or ''), false) end
if auto_touched then return refuse(auto_touched, 'breaker open (automatic): ' .. (br[5] or '') .. where(auto_touched), false) end
for _, p in ipairs(P) do
  if p.spent + cost > p.cap then
    return refuse(p, 'budget exhausted: cost ' .. cost_s .. ' exceeds the ' .. string.format('%d', p.cap - p.spent) ..
                  ' units left of the cap' .. where(p), true)
  end
  local limit = p.cap - p.reserve + p.grant
  if may_use == '1' or limit > p.cap then limit = p.cap end
  if p.spent + cost > limit then
    return refuse(p, 'pool exhausted: cost ' .. cost_s .. ' exceeds the ' .. string.format('%d', math.max(0, limit - p.spent)) ..
                  ' units left outside the reserve (only may_use_reserve metrics or an operator grant draw on it)' .. where(p), false)
  end
  if p.dspent + delta > p.dcap then
    return refuse(p, 'selection delta exhausted: delta ' .. delta_s .. ' exceeds the ' ..
                  string.format('%d', math.max(0, p.dcap - p.dspent)) .. ' units (1e-18) left of the period\'s selection delta cap' ..
                  where(p), false)
  end
end

-- 4. charge every touched period, store the final payload, audit
local before = {}
for i, p in ipairs(P) do
  before[i] = state_of(p, p.spent, false)
  touch_period(p)
end
for i, p in ipairs(P) do
  p.spent = redis.call('HINCRBY', p.key, 'spent', cost_s)
  redis.call('HINCRBY', p.key, 'version', 1)
  p.dspent = redis.call('HINCRBY', p.key, 'delta_spent', delta_s)
  redis.call('HINCRBY', p.key, 'granted', 1)
  redis.call('ZADD', p.ends, wend, rid)
  redis.call('EXPIRE', p.ends, retention)
end
local ratio = ratio_of(main, main.spent)
local payload = ARGV[2]
local i, j = string.find(payload, '"ratio_after":null', 1, true)
if i then payload = string.sub(payload, 1, i - 1) .. '"ratio_after":' .. ratio .. string.sub(payload, j + 1) end
local extra_ids = {}
for k = 2, #P do extra_ids[#extra_ids + 1] = P[k].pid end
redis.call('HSET', KEYS[4], 'state', 'reserved', 'period', pid, 'metric', metric, 'window_start', wstart,
           'window_end', wend, 'cost', cost_s, 'delta', delta_s, 'extra_periods', table.concat(extra_ids, ' '),
           'payload', payload, 'ratio_after', ratio, 'reserved_at', now)
redis.call('EXPIRE', KEYS[4], retention)
redis.call('ZADD', KEYS[7], now, rid)
for k, p in ipairs(P) do
  local after = state_of(p, p.spent, false)
  audit(p, 'charge', {'release_id', rid, 'metric', metric, 'cost', cost_s, 'delta', delta_s, 'state', after})
  if after ~= before[k] then
    audit(p, 'state', {'reason', before[k] .. ' -> ' .. after .. ' at ratio ' .. ratio_of(p, p.spent),
                       'actor', 'ledger', 'state', after})
  end
end
return reply('granted', main, main.spent, state_of(main, main.spent, false), cost, payload)
