-- quote.lua: what a quote prices from, in one atomic read that writes nothing.
--
-- KEYS[1] config   hash  dpstream:{S}:config
-- KEYS[2] breaker  hash  dpstream:{S}:breaker
-- KEYS[3] period   hash  dpstream:{S}:period:P      the priced period's block
-- KEYS[4..] ends   zset  dpstream:{S}:period:P:ends:M  one per metric of the scope, window end scores
-- ARGV[1] the priced window's end (epoch s)
-- Returns {config, breaker, period (each HGETALL's flat field/value list), counts}, counts holding
-- for each metric in KEYS order its charges ending at or after the end, before it, and at it.
-- One script rather than MULTI: the same one consistent read, at less than half the client's CPU.

local e = ARGV[1]
local counts = {}
for i = 4, #KEYS do
  counts[#counts + 1] = redis.call('ZCOUNT', KEYS[i], e, '+inf')
  counts[#counts + 1] = redis.call('ZCOUNT', KEYS[i], '-inf', '(' .. e)
  counts[#counts + 1] = redis.call('ZCOUNT', KEYS[i], e, e)
end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3]), counts}
