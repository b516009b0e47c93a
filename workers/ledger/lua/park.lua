-- park.lua: hold a window whose release keeps failing on an internal error, and let an operator
-- retry it; every change is audited.
--
-- KEYS[1] parked  hash    dpstream:{S}:parked   release_id -> JSON {metric, window_start, window_end,
--                                               period, attempts, error, parked_at, state, retry_actor,
--                                               retry_reason, retry_at}
-- KEYS[2] audit   stream  dpstream:{S}:audit
-- ARGV[1] action:
--   'park'   [2] release_id [3] metric [4] window_start [5] window_end [6] attempts (integer > 0)
--            [7] error class name [8] actor [9] now_ms [10] period id
--            -> 1 parked now (new, or a retried one that failed again), 0 already parked
--   'retry'  [2] release_id, or '' for every parked window [3] actor [4] reason [5] now_ms
--            -> how many windows went from parked to retry
--   'unpark' [2] release_id [3] outcome of the release [4] actor [5] now_ms
--            -> 1 removed, 0 not parked
-- Invariants: only schedule facts, counts and an error class name are stored or audited (never a
-- value, a key or an aggregate); a parked window is never dropped: it leaves the hash only by
-- 'unpark' after its release finished; a retry needs a non-empty actor and reason.

local action = ARGV[1]
local function audit(kind, fields)
  local entry = {'kind', kind}
  for i = 1, #fields, 2 do
    if fields[i + 1] ~= nil and fields[i + 1] ~= '' then
      entry[#entry + 1] = fields[i]
      entry[#entry + 1] = fields[i + 1]
    end
  end
  redis.call('XADD', KEYS[2], '*', unpack(entry))
end
local function one_line(name, value)
  if value == nil or value == '' or string.find(value, '\n', 1, true) then
    return redis.error_reply('dpstream: park: ' .. name .. ' must be non-empty and on one line')
  end
  return nil
end

if action == 'park' then
  local rid, metric, ws, we, attempts, err, actor, now, pid =
    ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
  for i, name in ipairs({'release_id', 'metric', 'window_start', 'window_end', 'attempts', 'error', 'actor',
                         'now_ms', 'period'}) do
    local bad = one_line(name, ARGV[i + 1])
    if bad then return bad end
  end
  local n = tonumber(attempts)
  if not n or n < 1 or n ~= math.floor(n) or not tonumber(ws) or not tonumber(we) then
    return redis.error_reply('dpstream: park: bad attempts or window')
  end
  if not string.match(err, '^[%w_.]+$') or #err > 100 then
    return redis.error_reply('dpstream: park: the error must be a class name')
  end
  local old = redis.call('HGET', KEYS[1], rid)
  if old and cjson.decode(old)['state'] == 'parked' then return 0 end
  redis.call('HSET', KEYS[1], rid, cjson.encode({metric = metric, window_start = tonumber(ws),
    window_end = tonumber(we), period = pid, attempts = n, error = err, parked_at = tonumber(now),
    state = 'parked', actor = actor}))
  audit('park', {'period', pid, 'release_id', rid, 'metric', metric, 'window_start', ws, 'window_end', we,
                 'attempts', attempts, 'error', err, 'actor', actor, 'state', 'parked',
                 'reason', 'release failed ' .. attempts .. ' times on an internal error (' .. err ..
                 '): parked until `dpstream budget retry`'})
  return 1
elseif action == 'retry' then
  local rid, actor, reason, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  local bad = one_line('actor', actor) or one_line('reason', reason)
  if bad then return bad end
  local ids = {}
  if rid ~= '' then
    ids[1] = rid
  else
    ids = redis.call('HKEYS', KEYS[1])
  end
  local n = 0
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', KEYS[1], id)
    if raw then
      local e = cjson.decode(raw)
      if e['state'] == 'parked' then
        e['state'] = 'retry'
        e['retry_actor'] = actor
        e['retry_reason'] = reason
        e['retry_at'] = tonumber(now)
        redis.call('HSET', KEYS[1], id, cjson.encode(e))
        audit('retry', {'period', e['period'], 'release_id', id, 'metric', e['metric'], 'attempts',
                        tostring(e['attempts']), 'actor', actor, 'state', 'retry', 'reason', reason})
        n = n + 1
      end
    end
  end
  return n
elseif action == 'unpark' then
  local rid, outcome, actor, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  local raw = redis.call('HGET', KEYS[1], rid)
  if not raw then return 0 end
  local e = cjson.decode(raw)
  redis.call('HDEL', KEYS[1], rid)
  audit('unpark', {'period', e['period'], 'release_id', rid, 'metric', e['metric'], 'actor', actor,
                   'state', outcome, 'reason', 'parked window released after a retry (' .. outcome .. ')'})
  return 1
end
return redis.error_reply('dpstream: park: action must be park, retry or unpark, got ' .. tostring(action))
