"""The Lua script that settles a gateway replica's capacity leases in Redis, atomically.

Keys, under the namespace `ns` of the replicas' Redis settings (shared by every band):

- `ns:leasers`            sorted set gateway id -> its last sync (ms, Redis clock)
- `ns:lease:s:<url>`      hash gateway id -> the requests it may have on that upstream
- `ns:lease:t:<url>`      hash gateway id -> the in-flight tokens it may hold there
- `ns:claims:<model>`     hash gateway id -> "band counter" of its best waiting request
                          for that model (none: no field)

A gateway whose last sync is older than the TTL is dead: its fields are dropped where
they are met, so its capacity returns to the pool. Upstreams are keyed by URL, which
every replica's config gives alike. A sync that gives capacity back to replicas with a
better claim publishes its gateway id on the channel `ns:leases`, and they sync at once.
"""

from __future__ import annotations

# ARGV: ns, gw, ttl_ms, announce (1: publish on ns:leases), n_upstreams,
#   (url, cap_slots, cap_tokens, want_slots, want_tokens, floor_slots, floor_tokens) x n,
#   n_models, (model, claim or '') x n_models
# Each lease becomes max(floor, min(want, capacity - what the other live replicas hold));
# a capacity of 0 is no limit. Returns, per upstream, its lease of slots, the others'
# slots, its lease of tokens, the others' tokens; then the live replicas (this one
# included); then, per model, the other live replicas' claims.
SYNC = r"""
local ns, gw, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ARGV[4] == '1' then redis.call('PUBLISH', ns .. ':leases', gw) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leasers = ns .. ':leasers'
redis.call('ZADD', leasers, now, gw)
-- Long dead: every lease of theirs has been dropped where it was met by now.
redis.call('ZREMRANGEBYSCORE', leasers, '-inf', now - 10 * ttl)
local alive = {}
local function live(g)
  if alive[g] == nil then
    local seen = redis.call('ZSCORE', leasers, g)
    alive[g] = seen ~= false and tonumber(seen) >= now - ttl
  end
  return alive[g]
end
local function others(key)
  local sum = 0
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    local g = flat[i]
    if g ~= gw then
      if live(g) then sum = sum + tonumber(flat[i + 1]) else redis.call('HDEL', key, g) end
    end
  end
  return sum
end
local function settle(key, cap, want, floor)
  local held = others(key)
  local grant = want
  if cap > 0 and grant > cap - held then grant = cap - held end
  if grant < floor then grant = floor end
  if grant > 0 then redis.call('HSET', key, gw, grant) else redis.call('HDEL', key, gw) end
  return grant, held
end
local out = {}
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  local url = ARGV[i]
  local slots, others_slots = settle(ns .. ':lease:s:' .. url, tonumber(ARGV[i + 1]),
    tonumber(ARGV[i + 3]), tonumber(ARGV[i + 5]))
  local tokens, others_tokens = settle(ns .. ':lease:t:' .. url, tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 4]), tonumber(ARGV[i + 6]))
  out[#out + 1] = slots
  out[#out + 1] = others_slots
  out[#out + 1] = tokens
  out[#out + 1] = others_tokens
  i = i + 7
end
out[#out + 1] = redis.call('ZCOUNT', leasers, now - ttl, '+inf')
local n = tonumber(ARGV[i])
i = i + 1
for _ = 1, n do
  local key = ns .. ':claims:' .. ARGV[i]
  if ARGV[i + 1] == '' then
    redis.call('HDEL', key, gw)
  else
    redis.call('HSET', key, gw, ARGV[i + 1])
  end
  local theirs = {}
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    if flat[j] ~= gw then
      if live(flat[j]) then theirs[#theirs + 1] = flat[j + 1] else redis.call('HDEL', key, flat[j]) end
    end
  end
  out[#out + 1] = theirs
  i = i + 2
end
return out
"""
