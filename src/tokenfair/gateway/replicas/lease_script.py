"""The Lua script that settles a gateway replica's capacity leases in Redis, atomically.

Keys, under the namespace `ns` of the replicas' Redis settings (shared by every band):

- `ns:leasers`            sorted set gateway id -> its last sync (ms, Redis clock)
- `ns:lease:s:<url>`      hash gateway id -> the requests it may have on that upstream
- `ns:lease:t:<url>`      hash gateway id -> the in-flight tokens it may hold there
- `ns:turns:<url>`        hash: the period, each replica's credit, and the replicas
                          holding one more slot this period (below)
- `ns:claims:<model>`     hash gateway id -> what its waiting requests for that model
                          ask (no field: none waits there), tab-separated: the best
                          band, the best counter, the requests and tokens it would
                          hold (running and waiting), then (top-level node, weight)
                          for every tenant or group waiting there

A gateway whose last sync is older than the TTL is dead: its fields are dropped where
they are met, so its capacity returns to the pool. Upstreams are keyed by URL, which
every replica's config gives alike. A sync that gives capacity back, makes a claim for
a model this replica had none for, or is a replica's last, grants what is free to the
replicas due more than they hold, and publishes on the channel `ns:leases` their new
leases (they apply them without a sync) and the ids of the replicas holding more than
their due (they sync at once).

How an upstream is divided among the replicas whose requests wait for it (those at the
best band): in proportion to the weights waiting at each, a tenant or group waiting at
n replicas counting 1/n of its weight at each, and none above what it would hold
(water-filling, so what one cannot use goes to the others). A share's fraction of a
slot is held in turns, period by period (of `period_ms`, Redis time), by smooth weighted
round robin (`ns:turns:<url>`), so that over any run of periods each holds its share to
within one period's slot. The shared counters then order the tenants
within each replica, and the tenant waiting at several replicas is evened out by them.
"""

from __future__ import annotations

# ARGV: ns, gw, ttl_ms, announce (1: publish on ns:leases; 2: and this replica leaves,
#   everything it holds goes back; 3: and no lease grows, the first sync after an
#   outage), period_ms, n_upstreams,
#   (url, cap_slots, cap_tokens, need_slots, need_tokens, floor_slots, floor_tokens,
#    n_models, model x n_models) x n_upstreams,
#   n_models, (model, claim or '') x n_models
# Each lease becomes max(floor, min(want, capacity - what the other live replicas
# hold)); a capacity of 0 is no limit. want: with nobody else waiting for the upstream,
# what this replica needs and at least its share of the capacity (the capacity over the
# live replicas) in reserve; with others waiting, its share as above (0 when it waits
# at a worse band or not at all), and beyond it what nobody else holds or is due.
# Returns, per upstream: its lease of slots, the others' slots, its lease of tokens,
# the others' tokens, its want of slots, of tokens; then the live replicas (this one
# included) and Redis's time (ms: the replicas sync just after each period begins).
SYNC = r"""
local ns, gw, ttl, period = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])
local leaving = ARGV[4] == '2'
local announcing = ARGV[4] ~= '0'
local told = {}  -- id and upstream -> what to tell that replica (below)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leasers = ns .. ':leasers'
redis.call('ZADD', leasers, now, gw)
-- Every replica's last sync, in one read: the live ones, and the long dead (every
-- lease of theirs has been dropped where it was met by now) to forget.
local alive, live_count, long_dead = {}, 0, {}
local seen = redis.call('ZRANGE', leasers, 0, -1, 'WITHSCORES')
for j = 1, #seen, 2 do
  local at = tonumber(seen[j + 1])
  alive[seen[j]] = at >= now - ttl
  if alive[seen[j]] then live_count = live_count + 1 end
  if at < now - 10 * ttl then long_dead[#long_dead + 1] = seen[j] end
end
if #long_dead > 0 then redis.call('ZREM', leasers, unpack(long_dead)) end
local function live(g)
  return alive[g] == true
end
-- What the other live replicas hold: the sum, and each one's.
local function others(key)
  local sum, each = 0, {}
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    local g = flat[i]
    if g ~= gw then
      if live(g) then
        each[g] = tonumber(flat[i + 1])
        sum = sum + each[g]
      else
        redis.call('HDEL', key, g)
      end
    end
  end
  return sum, each
end
local function fields(text)
  local out = {}
  for field in string.gmatch(text, '[^\t]+') do out[#out + 1] = field end
  return out
end
-- Which of `who` hold one more unit this period, m of them: smooth weighted round robin,
-- kept in `key` (the period, each replica's credit, the period's choice). Each period
-- every replica's credit grows by its fraction, and the m with the most (ties: the
-- first id) hold one more and lose 1 of credit: over any run of periods, each holds
-- its fractions' sum to within one. The first sync of a period chooses; the others in
-- it read the choice.
local function turns(key, who, fraction, m)
  local k = math.floor(now / period)
  local flat = redis.call('HGETALL', key)
  local state = {}
  for j = 1, #flat, 2 do state[flat[j]] = flat[j + 1] end
  local chosen = {}
  if tonumber(state.k) == k and state.e ~= nil then
    for g in string.gmatch(state.e, '[^ ]+') do chosen[g] = true end
    return chosen
  end
  -- Credit carries over from the last period only: after a pause, every replica
  -- starts again from its fraction.
  local carry = tonumber(state.k) == k - 1
  local credit, order = {}, {}
  for _, g in ipairs(who) do
    credit[g] = (carry and tonumber(state['c:' .. g] or '0') or 0) + fraction[g]
    order[#order + 1] = g
  end
  table.sort(order, function(a, b)
    if credit[a] ~= credit[b] then return credit[a] > credit[b] end
    return a < b
  end)
  local writes, names = {'k', tostring(k)}, {}
  for index, g in ipairs(order) do
    if index <= m then
      chosen[g] = true
      credit[g] = credit[g] - 1
      names[#names + 1] = g
    end
    writes[#writes + 1] = 'c:' .. g
    writes[#writes + 1] = string.format('%.17g', credit[g])
  end
  writes[#writes + 1] = 'e'
  writes[#writes + 1] = table.concat(names, ' ')
  redis.call('HSET', key, unpack(writes))
  return chosen
end
-- The capacity divided among `who` (sorted ids) by weight, none above its need
-- (water-filling); whole units, the fractions held in turns (`turns`, when `key` is
-- given: slots) or by the largest fractions (tokens, where one is next to nothing).
local function share(cap, who, weight, need, key)
  local exact, active, left = {}, {}, cap
  for _, g in ipairs(who) do active[#active + 1] = g end
  while #active > 0 do
    local total = 0
    for _, g in ipairs(active) do total = total + weight[g] end
    local full, rest = {}, {}
    for _, g in ipairs(active) do
      local s = total > 0 and left * weight[g] / total or left / #active
      if s >= need[g] then full[#full + 1] = g else rest[#rest + 1] = g end
    end
    if #full == 0 then
      for _, g in ipairs(active) do
        exact[g] = total > 0 and left * weight[g] / total or left / #active
      end
      break
    end
    for _, g in ipairs(full) do
      exact[g] = need[g]
      left = left - need[g]
    end
    active = rest
  end
  local whole, fraction, laid = {}, {}, 0
  for _, g in ipairs(who) do
    local s = exact[g] or 0
    whole[g] = math.floor(s + 1e-9)
    fraction[g] = math.max(0, s - whole[g])
    laid = laid + fraction[g]
  end
  local m = math.floor(laid + 0.5)
  if m == 0 then return whole end
  local extra
  if key ~= nil then
    extra = turns(key, who, fraction, m)
  else
    local order = {}
    for _, g in ipairs(who) do order[#order + 1] = g end
    table.sort(order, function(a, b)
      if fraction[a] ~= fraction[b] then return fraction[a] > fraction[b] end
      return a < b
    end)
    extra = {}
    for index = 1, m do extra[order[index]] = true end
  end
  for g, _ in pairs(extra) do
    if whole[g] ~= nil then whole[g] = whole[g] + 1 end
  end
  return whole
end
local recovering = ARGV[4] == '3'
-- This replica's lease on one limit of an upstream. A limit of 0 (none): nothing is
-- kept in Redis, the lease is what it wants.
local function settle(key, cap, want, floor, held)
  local grant = want
  if recovering and grant > floor then grant = floor end
  if cap > 0 and grant > cap - held then grant = cap - held end
  if grant < floor then grant = floor end
  if cap > 0 then
    if grant > 0 then redis.call('HSET', key, gw, grant) else redis.call('HDEL', key, gw) end
  end
  return grant, held
end

local ups = {}
local i = 7
for u = 1, tonumber(ARGV[6]) do
  local up = {url = ARGV[i], cap_s = tonumber(ARGV[i + 1]), cap_t = tonumber(ARGV[i + 2]),
    need_s = tonumber(ARGV[i + 3]), need_t = tonumber(ARGV[i + 4]),
    floor_s = tonumber(ARGV[i + 5]), floor_t = tonumber(ARGV[i + 6]), models = {}}
  local n = tonumber(ARGV[i + 7])
  for k = 1, n do up.models[k] = ARGV[i + 7 + k] end
  ups[u] = up
  i = i + 8 + n
end
-- Every live replica's claims, this one's written first.
local claims = {}  -- model -> gateway -> {band, need_s, need_t, nodes}
local claimed = false  -- a claim this replica did not have: the others hear it at once
for _ = 1, tonumber(ARGV[i]) do
  local model, mine = ARGV[i + 1], ARGV[i + 2]
  local key = ns .. ':claims:' .. model
  if mine == '' then
    redis.call('HDEL', key, gw)
  elseif redis.call('HSET', key, gw, mine) == 1 then
    claimed = true
  end
  local byg = {}
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    local g = flat[j]
    if g == gw or live(g) then
      local f = fields(flat[j + 1])
      local nodes = {}
      for k = 5, #f - 1, 2 do nodes[f[k]] = tonumber(f[k + 1]) end
      byg[g] = {band = tonumber(f[1]), need_s = tonumber(f[3]), need_t = tonumber(f[4]),
        nodes = nodes}
    else
      redis.call('HDEL', key, g)
    end
  end
  claims[model] = byg
  i = i + 2
end

local out = {}
for _, up in ipairs(ups) do
  local key_s, key_t = ns .. ':lease:s:' .. up.url, ns .. ':lease:t:' .. up.url
  local held_s, each_s = 0, {}
  if up.cap_s > 0 then held_s, each_s = others(key_s) end
  local held_t, each_t = 0, {}
  if up.cap_t > 0 then held_t, each_t = others(key_t) end
  -- Who waits for this upstream, at which band, with which weights and needs.
  local per, best = {}, nil
  for _, model in ipairs(up.models) do
    for g, c in pairs(claims[model] or {}) do
      local p = per[g]
      if p == nil then
        p = {band = c.band, need_s = 0, need_t = 0, nodes = {}}
        per[g] = p
      end
      if c.band < p.band then p.band = c.band end
      p.need_s, p.need_t = p.need_s + c.need_s, p.need_t + c.need_t
      for node, w in pairs(c.nodes) do p.nodes[node] = w end
      if best == nil or c.band < best then best = c.band end
    end
  end
  local anyone_else = false
  for g, _ in pairs(per) do
    if g ~= gw then anyone_else = true end
  end
  local want_s, want_t = 0, 0
  local due_s, due_t = {}, {}
  local who_sorted = {}
  if not anyone_else then
    if not leaving then
      want_s = math.max(up.need_s, math.floor(up.cap_s / live_count))
      want_t = math.max(up.need_t, math.floor(up.cap_t / live_count))
    end
  else
    local who, count = {}, {}
    for g, p in pairs(per) do
      if p.band == best and not (g == gw and leaving) then
        who[#who + 1] = g
        for node, _ in pairs(p.nodes) do count[node] = (count[node] or 0) + 1 end
      end
    end
    table.sort(who)
    who_sorted = who
    local weight, need_s, need_t = {}, {}, {}
    for _, g in ipairs(who) do
      local w = 0
      for node, wn in pairs(per[g].nodes) do w = w + wn / count[node] end
      weight[g] = w
      if g == gw then
        need_s[g], need_t[g] = up.need_s, up.need_t
      else
        need_s[g], need_t[g] = per[g].need_s, per[g].need_t
      end
    end
    local function want(cap, mine_need, needs, held, turns_key)
      if cap <= 0 then return leaving and 0 or mine_need, {} end
      local due = share(cap, who, weight, needs, turns_key)
      if leaving then return 0, due end
      -- Beyond its share: what no other replica holds or is due.
      local taken = 0
      local listed = {}
      for _, g in ipairs(who) do
        if g ~= gw then
          taken = taken + math.max(held[g] or 0, due[g])
          listed[g] = true
        end
      end
      for g, h in pairs(held) do
        if not listed[g] then taken = taken + h end
      end
      if due[gw] == nil then return 0, due end
      return math.min(mine_need, math.max(due[gw], cap - taken)), due
    end
    want_s, due_s = want(up.cap_s, up.need_s, need_s, each_s, ns .. ':turns:' .. up.url)
    want_t, due_t = want(up.cap_t, up.need_t, need_t, each_t, nil)
  end
  local slots, others_slots = settle(key_s, up.cap_s, want_s, up.floor_s, held_s)
  local tokens, others_tokens = settle(key_t, up.cap_t, want_t, up.floor_t, held_t)
  -- Whom to tell, when capacity was given back, a claim is new or this replica
  -- leaves: a replica due more than it holds, while capacity is free, is granted it
  -- here (its lease in Redis grows, and the announcement carries the new lease: it
  -- needs no sync of its own); with a new claim, a replica holding more than its due
  -- is told to sync (it gives back as its requests end).
  local function tell(cap, due, each, free, key, which)
    if cap <= 0 or not (announcing or claimed) then return end
    for _, g in ipairs(who_sorted) do
      local d, h = due[g], each[g] or 0
      if d ~= nil and g ~= gw then
        local entry = told[g .. '\t' .. up.url]
        if h < d and free > 0 then
          local lease = h + math.min(d - h, free)
          free = free - (lease - h)
          redis.call('HSET', key, g, lease)
          entry = entry or {g = g, url = up.url}
          entry[which] = lease
        elseif claimed and h > d then
          entry = entry or {g = g, url = up.url}
        end
        told[g .. '\t' .. up.url] = entry
      end
    end
  end
  tell(up.cap_s, due_s, each_s, up.cap_s - held_s - slots, key_s, 's')
  tell(up.cap_t, due_t, each_t, up.cap_t - held_t - tokens, key_t, 't')
  out[#out + 1] = slots
  out[#out + 1] = others_slots
  out[#out + 1] = tokens
  out[#out + 1] = others_tokens
  out[#out + 1] = want_s
  out[#out + 1] = want_t
end
out[#out + 1] = live_count
out[#out + 1] = now
-- Capacity given back, a new claim, or this replica leaving: the replicas whose due
-- now differs from what they hold sync at once.
-- The announcement: Redis's time, then a line per replica and upstream told: its id,
-- the upstream, and the lease granted it here ('' if none: it is to sync).
local lines = {}
for _, entry in pairs(told) do
  lines[#lines + 1] = entry.g .. '\t' .. entry.url .. '\t' .. (entry.s or '') .. '\t' .. (entry.t or '')
end
if #lines > 0 then
  table.sort(lines)
  redis.call('PUBLISH', ns .. ':leases', tostring(now) .. '\n' .. table.concat(lines, '\n'))
end
return out
"""


def claim_text(claim: tuple[int, float], slots: int, tokens: int, nodes: dict[str, float]) -> str:
    """A replica's claim for a model, as `ns:claims:<model>` holds it: its best band and
    counter, the requests and tokens it would hold, and the nodes waiting, weighted."""
    band, counter = claim
    weighted = (f"{node}\t{weight!r}" for node, weight in sorted(nodes.items()))
    return "\t".join((str(band), repr(counter), str(slots), str(tokens), *weighted))


Grant = tuple[str, int | None, int | None]  # upstream URL, slots, tokens (None: none)


def announced(text: str, gateway_id: str) -> tuple[int, list[Grant]]:
    """An announcement on `ns:leases`: Redis's time when it was made, and what it says
    to `gateway_id`, per upstream (a lease granted, or nothing: sync)."""
    head, _, body = text.partition("\n")
    if not head.isdigit():
        return 0, []
    grants: list[Grant] = []
    for line in body.split("\n"):
        fields = line.split("\t")
        if len(fields) == 4 and fields[0] == gateway_id:
            slots, tokens = (int(f) if f else None for f in fields[2:])
            grants.append((fields[1], slots, tokens))
    return int(head), grants
