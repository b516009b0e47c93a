-- register.lua: store a scope's config; a changed config is audited with its old and new digest.
--
-- KEYS[1] config  hash    dpstream:{S}:config
-- KEYS[2] audit   stream  dpstream:{S}:audit
-- ARGV: [1] digest [2] actor [3] now_ms [4..] field, value pairs (including 'digest')
-- Returns 1 when the config was new or changed (and audited), 0 when unchanged.

local old = redis.call('HGET', KEYS[1], 'digest')
if old == ARGV[1] then return 0 end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HSET', KEYS[1], 'registered_at', ARGV[3])
local reason = 'config registered ' .. ARGV[1]
if old then reason = 'config changed ' .. old .. ' -> ' .. ARGV[1] end
local cap = redis.call('HGET', KEYS[1], 'cap')
redis.call('XADD', KEYS[2], '*', 'kind', 'config', 'cost', cap,
           'reason', reason, 'actor', ARGV[2])
return 1
