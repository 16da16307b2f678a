"""The Lua scripts that keep VTC's shared state in Redis, each run atomically.

Keys, all under one namespace `ns`:

- `ns:counters`      hash tenant -> virtual counter (float)
- `ns:last`          the tenant whose request most recently left a waiting queue
- `ns:gateways`      sorted set gateway id -> last heartbeat (ms, Redis clock)
- `ns:waiting:<gw>`  hash tenant -> requests waiting in that gateway

A gateway whose heartbeat is older than the TTL is dropped with its waiting hash, so a
crashed replica cannot leave tenants "waiting" for ever. Every script first applies the
caller's buffered charges (pairs tenant, amount in ARGV), so one round trip both flushes
output charges and decides. Times come from Redis (TIME), never from the gateways'
clocks. Keys are built inside the scripts: single Redis or a replicated primary, not
Redis Cluster.
"""

from __future__ import annotations

# Shared prelude: helpers every script uses.
_PRELUDE = r"""
local ns = ARGV[1]
local gw = ARGV[2]
local counters = ns .. ':counters'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function apply_deltas(from, n)
  for i = from, from + 2 * n - 1, 2 do
    redis.call('HINCRBYFLOAT', counters, ARGV[i], ARGV[i + 1])
  end
  return from + 2 * n
end
local function counter(tenant)
  return tonumber(redis.call('HGET', counters, tenant) or '0')
end
-- tenant -> waiting count summed over the live gateways; drops dead gateways.
local function waiting_everywhere(ttl_ms)
  local gateways = ns .. ':gateways'
  local dead = redis.call('ZRANGEBYSCORE', gateways, '-inf', now_ms() - ttl_ms)
  for _, g in ipairs(dead) do
    if g ~= gw then
      redis.call('DEL', ns .. ':waiting:' .. g)
      redis.call('ZREM', gateways, g)
    end
  end
  local total = {}
  for _, g in ipairs(redis.call('ZRANGE', gateways, 0, -1)) do
    local flat = redis.call('HGETALL', ns .. ':waiting:' .. g)
    for i = 1, #flat, 2 do
      local n = tonumber(flat[i + 1])
      if n > 0 then total[flat[i]] = (total[flat[i]] or 0) + n end
    end
  end
  return total
end
"""

# ARGV: ns, gw, ttl_ms, n_deltas, deltas..., tenant, lift rule (paper|artifact|none)
# A tenant with no waiting request anywhere is lifted (SPEC 3): to the smallest counter
# among tenants waiting anywhere, or with nobody waiting to the counter of the tenant
# admitted last (paper rule). Returns the tenant's counter after the lift.
# The lift (SPEC 3), shared by ARRIVE and ARRIVE_TAKE: a tenant with no waiting request
# anywhere is lifted to the smallest counter among tenants waiting anywhere, or with
# nobody waiting to the counter of the tenant admitted last (paper rule).
_LIFT = r"""
local function lift(tenant, rule, ttl_ms)
  local c = counter(tenant)
  local waiting = waiting_everywhere(ttl_ms)
  if rule ~= 'none' and not waiting[tenant] then
    local floor = nil
    for t, _ in pairs(waiting) do
      local ct = counter(t)
      if floor == nil or ct < floor then floor = ct end
    end
    if floor == nil and rule == 'paper' then
      local last = redis.call('GET', ns .. ':last')
      if last then floor = counter(last) end
    end
    if floor ~= nil and floor > c then
      c = floor
      redis.call('HSET', counters, tenant, tostring(c))
    end
  end
  return c
end
-- ARGV from 3 on: ttl_ms, n_deltas, deltas..., tenant, lift rule: this gateway is
-- alive, the buffered charges are applied, the tenant is lifted. Returns the index of
-- the tenant in ARGV and its counter after the lift.
local function arrival()
  redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
  local i = apply_deltas(5, tonumber(ARGV[4]))
  return i, lift(ARGV[i], ARGV[i + 1], tonumber(ARGV[3]))
end
"""

# ARGV: ns, gw, ttl_ms, n_deltas, deltas..., tenant, lift rule (paper|artifact|none)
# The tenant's request starts waiting here. Returns its counter after the lift.
ARRIVE = (
    _PRELUDE
    + _LIFT
    + r"""
local i, c = arrival()
redis.call('HINCRBY', ns .. ':waiting:' .. gw, ARGV[i], 1)
return tostring(c)
"""
)

# ARGV: ns, gw, ttl_ms, n_deltas, deltas..., tenant, lift rule, charge
# ARRIVE then PICK of that request alone, in one step: it found nothing waiting in this
# gateway and room upstream. Lifted, charged, recorded as the last admitted; it never
# counts as waiting. Returns the tenant's counter after the charge.
ARRIVE_TAKE = (
    _PRELUDE
    + _LIFT
    + r"""
local i = arrival()
local c = redis.call('HINCRBYFLOAT', counters, ARGV[i], ARGV[i + 2])
redis.call('SET', ns .. ':last', ARGV[i])
return c
"""
)

# ARGV: ns, gw, n_deltas, deltas..., n_candidates, (tenant, charge)...
# Picks the candidate with the smallest counter (ties: the first given, i.e. the
# oldest head), charges it, counts one of its requests out of this gateway's waiting
# hash and records it as the last admitted. Returns {tenant, counter}.
PICK = (
    _PRELUDE
    + r"""
local i = apply_deltas(4, tonumber(ARGV[3]))
local n = tonumber(ARGV[i])
local best, best_c, charge = nil, nil, 0
for j = i + 1, i + 2 * n - 1, 2 do
  local c = counter(ARGV[j])
  if best == nil or c < best_c then best, best_c, charge = ARGV[j], c, ARGV[j + 1] end
end
local c = redis.call('HINCRBYFLOAT', counters, best, charge)
local key = ns .. ':waiting:' .. gw
if redis.call('HINCRBY', key, best, -1) <= 0 then redis.call('HDEL', key, best) end
redis.call('SET', ns .. ':last', best)
return {best, c}
"""
)

# ARGV: ns, gw, n_deltas, deltas..., tenant. A waiting request left without dispatch.
LEAVE = (
    _PRELUDE
    + r"""
local i = apply_deltas(4, tonumber(ARGV[3]))
local key = ns .. ':waiting:' .. gw
if redis.call('HINCRBY', key, ARGV[i], -1) <= 0 then redis.call('HDEL', key, ARGV[i]) end
return 1
"""
)

# ARGV: ns, gw, n_deltas, deltas..., n_waiting, (tenant, count)...
# Liveness plus a full rewrite of this gateway's waiting hash (it heals any drift).
# Returns every counter, flat.
HEARTBEAT = (
    _PRELUDE
    + r"""
redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
local i = apply_deltas(4, tonumber(ARGV[3]))
local key = ns .. ':waiting:' .. gw
redis.call('DEL', key)
local n = tonumber(ARGV[i])
for j = i + 1, i + 2 * n - 1, 2 do
  redis.call('HSET', key, ARGV[j], ARGV[j + 1])
end
return redis.call('HGETALL', counters)
"""
)

# ARGV: ns, gw, n_deltas, deltas...: only flush buffered charges.
FLUSH = (
    _PRELUDE
    + r"""
apply_deltas(4, tonumber(ARGV[3]))
return 1
"""
)

# ARGV: ns, gw, n, (tenant, delta, local value)...
# After an outage: the charges made locally are added, and no counter ends below the
# value this gateway saw locally (a Redis that restarted empty is re-seeded).
RECONCILE = (
    _PRELUDE
    + r"""
local n = tonumber(ARGV[3])
for j = 4, 4 + 3 * n - 1, 3 do
  local merged = counter(ARGV[j]) + tonumber(ARGV[j + 1])
  local seen = tonumber(ARGV[j + 2])
  if seen > merged then merged = seen end
  redis.call('HSET', counters, ARGV[j], tostring(merged))
end
return redis.call('HGETALL', counters)
"""
)
