"""The Lua scripts that keep VTC's shared state in Redis, each run atomically.

Keys, all under one namespace `ns`:

- `ns:counters`      hash node -> virtual counter (float): tenants, and groups as `@path`
- `ns:last`          the top-level node (tenant or group) whose request most recently
                     left a waiting queue
- `ns:lastchild`     hash group -> its child that most recently did (with groups)
- `ns:paths`         hash tenant -> its path, `@org|@org/team|tenant` (grouped tenants)
- `ns:gateways`      sorted set gateway id -> last heartbeat (ms, Redis clock)
- `ns:waiting:<gw>`  hash tenant -> requests waiting in that gateway

A gateway whose heartbeat is older than the TTL is dropped with its waiting hash, so a
crashed replica cannot leave tenants "waiting" for ever. Every script first applies the
caller's buffered charges (pairs node, amount in ARGV), so one round trip both flushes
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
local function counter(node)
  return tonumber(redis.call('HGET', counters, node) or '0')
end
-- A number as text that reads back as the same double (tostring keeps 14 digits: a
-- lifted counter would come back above the one it was lifted to, and lose its tie).
local function exact(x)
  return string.format('%.17g', x)
end
-- Charge a chosen request: ARGV[from..] holds n (node, amount) pairs, top down; each
-- parent records the node as the child it admitted last.
local function take(from, n)
  local parent = ''
  for j = from, from + 2 * n - 1, 2 do
    redis.call('HINCRBYFLOAT', counters, ARGV[j], ARGV[j + 1])
    if parent == '' then
      redis.call('SET', ns .. ':last', ARGV[j])
    else
      redis.call('HSET', ns .. ':lastchild', parent, ARGV[j])
    end
    parent = ARGV[j]
  end
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

# The lift (SPEC 3) at every level of the group tree, shared by ARRIVE and ARRIVE_TAKE.
# A tenant's path is its nodes from the top-level group down to itself (just itself
# without groups). Each node on the arriving tenant's path that has no waiting request
# below it anywhere is lifted to the smallest counter among its parent's children that
# have one, or, with none, to the counter of the child its parent admitted last (the
# paper's rule). The top level's last child is `ns:last`; a group's, `ns:lastchild`.
_LIFT = r"""
local function path_of(tenant, grouped)
  if grouped then
    local joined = redis.call('HGET', ns .. ':paths', tenant)
    if joined then
      local out = {}
      for node in string.gmatch(joined, '[^|]+') do out[#out + 1] = node end
      return out
    end
  end
  return {tenant}
end
local function last_child(parent)
  if parent == '' then return redis.call('GET', ns .. ':last') end
  return redis.call('HGET', ns .. ':lastchild', parent)
end
local function lift(tenant, rule, ttl_ms, path)
  local grouped = #path > 1 or redis.call('EXISTS', ns .. ':paths') == 1
  if #path > 1 then redis.call('HSET', ns .. ':paths', tenant, table.concat(path, '|')) end
  local waiting = waiting_everywhere(ttl_ms)
  if rule ~= 'none' and not waiting[tenant] then
    local below = {}  -- parent -> set of its children with a request waiting below
    for t, _ in pairs(waiting) do
      local parent = ''
      for _, node in ipairs(path_of(t, grouped)) do
        below[parent] = below[parent] or {}
        below[parent][node] = true
        parent = node
      end
    end
    local parent = ''
    for _, node in ipairs(path) do
      local siblings = below[parent]
      if not (siblings and siblings[node]) then
        local c = counter(node)
        local floor = nil
        if siblings then
          for s, _ in pairs(siblings) do
            local cs = counter(s)
            if floor == nil or cs < floor then floor = cs end
          end
        end
        if floor == nil and rule == 'paper' then
          local last = last_child(parent)
          if last then floor = counter(last) end
        end
        if floor ~= nil and floor > c then
          redis.call('HSET', counters, node, exact(floor))
        end
      end
      parent = node
    end
  end
  return counter(tenant)
end
-- ARGV from 3 on: ttl_ms, n_deltas, deltas..., tenant, lift rule, n_path, path...:
-- this gateway is alive, the buffered charges are applied, the tenant is lifted.
-- Returns the index of the tenant in ARGV and its counter after the lift.
local function arrival()
  redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
  local i = apply_deltas(5, tonumber(ARGV[4]))
  local n = tonumber(ARGV[i + 2])
  local path = {}
  for j = i + 3, i + 2 + n do path[#path + 1] = ARGV[j] end
  return i, lift(ARGV[i], ARGV[i + 1], tonumber(ARGV[3]), path)
end
"""

# ARGV: ns, gw, ttl_ms, n_deltas, deltas..., tenant, lift rule, n_path, path...
# The tenant's request starts waiting here. Returns its counter after the lift.
ARRIVE = (
    _PRELUDE
    + _LIFT
    + r"""
local i, c = arrival()
redis.call('HINCRBY', ns .. ':waiting:' .. gw, ARGV[i], 1)
return exact(c)
"""
)

# ARGV: ns, gw, ttl_ms, n_deltas, deltas..., tenant, lift rule, n, (node, amount)...
# ARRIVE then PICK of that request alone, in one step: it found nothing waiting in this
# gateway and room upstream. Lifted, charged, recorded as the last admitted; it never
# counts as waiting. Returns the tenant's counter after the charge. (The path is the
# charge's nodes: n_path and the path are the n and the pairs' first halves.)
ARRIVE_TAKE = (
    _PRELUDE
    + _LIFT
    + r"""
redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
local i = apply_deltas(5, tonumber(ARGV[4]))
local n = tonumber(ARGV[i + 2])
local path = {}
for j = i + 3, i + 2 + 2 * n - 1, 2 do path[#path + 1] = ARGV[j] end
lift(ARGV[i], ARGV[i + 1], tonumber(ARGV[3]), path)
take(i + 3, n)
return exact(counter(ARGV[i]))
"""
)

# ARGV: ns, gw, n_deltas, deltas..., n_candidates, (tenant, n, (node, amount) x n)...
# Descends the tree: among the candidates, the top-level node with the smallest counter
# (ties: the first given, i.e. the oldest head), then its child with the smallest
# counter, down to a tenant; charges each node of its path, counts one of its requests
# out of this gateway's waiting hash, records the last admitted children.
# Returns {tenant, counter}.
PICK = (
    _PRELUDE
    + r"""
local i = apply_deltas(4, tonumber(ARGV[3]))
local n = tonumber(ARGV[i])
local remaining = {}  -- {tenant, n_nodes, index of its first node in ARGV}
local j = i + 1
for _ = 1, n do
  local k = tonumber(ARGV[j + 1])
  remaining[#remaining + 1] = {ARGV[j], k, j + 2}
  j = j + 2 + 2 * k
end
local depth = 0
while true do
  local best, best_c = nil, nil
  for _, cand in ipairs(remaining) do
    local node = ARGV[cand[3] + 2 * depth]
    local c = counter(node)
    if best == nil or c < best_c then best, best_c = node, c end
  end
  local kept = {}
  for _, cand in ipairs(remaining) do
    if ARGV[cand[3] + 2 * depth] == best then kept[#kept + 1] = cand end
  end
  remaining = kept
  if remaining[1][2] == depth + 1 then break end
  depth = depth + 1
end
local chosen = remaining[1]
take(chosen[3], chosen[2])
local key = ns .. ':waiting:' .. gw
if redis.call('HINCRBY', key, chosen[1], -1) <= 0 then redis.call('HDEL', key, chosen[1]) end
return {chosen[1], redis.call('HGET', counters, chosen[1])}
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
# Liveness; this gateway's waiting hash is written from its own count only when Redis
# has none while it has requests waiting (Redis restarted empty, or the others took it
# for dead): rewriting a hash that exists could undo an arrival sent at the same time.
# n_waiting -1: the gateway has calls in flight that change it; leave it. Returns every
# counter, flat.
HEARTBEAT = (
    _PRELUDE
    + r"""
redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
local i = apply_deltas(4, tonumber(ARGV[3]))
local key = ns .. ':waiting:' .. gw
local n = tonumber(ARGV[i])
if n > 0 and redis.call('EXISTS', key) == 0 then
  for j = i + 1, i + 2 * n - 1, 2 do
    redis.call('HSET', key, ARGV[j], ARGV[j + 1])
  end
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

# ARGV: ns, gw, n, (tenant, delta, local value)..., n_waiting, (tenant, count)...
# After an outage: the charges made locally are added, and no counter ends below the
# value this gateway saw locally (a Redis that restarted empty is re-seeded); this
# gateway's waiting hash is rewritten from its own count and it is alive again.
RECONCILE = (
    _PRELUDE
    + r"""
local n = tonumber(ARGV[3])
local i = 4
for j = 4, 4 + 3 * n - 1, 3 do
  local merged = counter(ARGV[j]) + tonumber(ARGV[j + 1])
  local seen = tonumber(ARGV[j + 2])
  if seen > merged then merged = seen end
  redis.call('HSET', counters, ARGV[j], exact(merged))
  i = j + 3
end
local key = ns .. ':waiting:' .. gw
redis.call('DEL', key)
local w = tonumber(ARGV[i])
for j = i + 1, i + 2 * w - 1, 2 do
  redis.call('HSET', key, ARGV[j], ARGV[j + 1])
end
redis.call('ZADD', ns .. ':gateways', now_ms(), gw)
return redis.call('HGETALL', counters)
"""
)
