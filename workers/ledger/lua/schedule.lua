-- schedule.lua: record the schedule start S with a registered scope; the first S recorded wins.
--
-- KEYS[1] config  hash  dpstream:{S}:config   gains the field `schedule_start` (epoch s)
-- ARGV: [1] S (whole epoch seconds >= 0)
-- Returns the scope's S as a string (the one stored before, or ARGV[1] when none was), or nil when
-- the scope is not registered (nothing written: a config hash holds a registered config only).
-- Invariants: `schedule_start` is written once and never changed (a later topology version's S,
-- or a restart's, leaves it as it is): no spend of the scope precedes it, so `Ledger.status`
-- projects a first period from it, whoever reads; re-registration keeps it (register.lua writes
-- only the config's own fields).

local s = ARGV[1]
local n = tonumber(s)
if not n or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('dpstream: schedule: bad start ' .. tostring(s))
end
local f = redis.call('HMGET', KEYS[1], 'digest', 'schedule_start')
if not f[1] then return false end
if f[2] then return f[2] end
redis.call('HSET', KEYS[1], 'schedule_start', s)
return s
