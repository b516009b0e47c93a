-- commit.lua: mark a charged release as published (after the releases topic acknowledged it).
--
-- KEYS[1] release  hash  dpstream:{S}:release:R
-- KEYS[2] pending  zset  dpstream:{S}:pending
-- ARGV: [1] release_id [2] now_ms
-- Returns 1 when charged -> published now, 2 when it was already published, 0 when unknown.
-- Invariant: never changes the charge or the payload.

local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
if state == 'published' then return 2 end
redis.call('HSET', KEYS[1], 'state', 'published', 'published_at', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
