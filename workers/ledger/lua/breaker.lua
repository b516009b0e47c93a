-- breaker.lua: an operator opens or closes a scope's breaker, with a reason; audited.
--
-- KEYS[1] breaker  hash    dpstream:{S}:breaker
-- KEYS[2] audit    stream  dpstream:{S}:audit
-- ARGV: [1] 'open' | 'close' [2] reason (non-empty) [3] actor [4] now_ms [5] current period id
-- Returns {changed 0|1, previous description}
-- Invariants: open sets the manual flag (it stays until closed); close clears the manual flag and
-- any automatic open, so the next release is judged by the budget alone.

local action, reason, actor, now, pid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if reason == nil or reason == '' then return redis.error_reply('dpstream: breaker: a reason is required') end
local br = redis.call('HMGET', KEYS[1], 'manual', 'auto_period')
local function audit(kind, state)
  redis.call('XADD', KEYS[2], '*', 'kind', kind, 'period', pid,
             'state', state, 'reason', reason, 'actor', actor)
end
if action == 'open' then
  if br[1] == '1' then return {0, 'already open (manual)'} end
  redis.call('HSET', KEYS[1], 'manual', '1', 'manual_reason', reason, 'manual_actor', actor, 'manual_at', now)
  audit('breaker_open', 'open')
  return {1, 'closed'}
elseif action == 'close' then
  if br[1] ~= '1' and not br[2] then return {0, 'already closed'} end
  redis.call('HDEL', KEYS[1], 'manual', 'manual_reason', 'manual_actor', 'manual_at',
             'auto_period', 'auto_start', 'auto_reason', 'auto_at')
  audit('breaker_close', 'closed')
  return {1, 'open'}
end
return redis.error_reply('dpstream: breaker: action must be open or close, got ' .. tostring(action))
