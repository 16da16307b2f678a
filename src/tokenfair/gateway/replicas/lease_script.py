"""The Lua script that settles a gateway replica's capacity leases in Redis, atomically.

One key, the hash `ns:capacity` (`ns`, the namespace of the replicas' Redis settings,
shared by every band), so that a sync reads it once and writes what changed once; its
fields, tab-separated:

- `seen <id>`              a replica's last sync (ms, Redis clock)
- `s <id> <url>`           the requests that replica may have on that upstream
- `t <id> <url>`           the in-flight tokens it may hold there
- `k <url>`, `e <url>`,    the turns on that upstream's slots (below): the period, the
  `c <id> <url>`           replicas holding one more slot in it, each one's credit
- `claim <id> <model>`     what that replica's waiting requests for the model ask (no
                           field: none waits there), tab-separated: the best band, the
                           requests and tokens it would hold (running and waiting),
                           then (top-level node, weight) for every tenant or group
                           waiting there

Redis commands per sync: the script, TIME, HGETALL, then HSET when something changed,
HDEL when something went, and PUBLISH when it announces: 3 to 6, however many
upstreams, models and replicas.

A gateway whose last sync is older than the TTL is dead: its fields are dropped where
they are met, so its capacity returns to the pool. Upstreams are keyed by URL, which
every replica's config gives alike. A sync that gives capacity back, makes a claim for
a model this replica had none for, or is a replica's last, grants what is free to the
replicas due more than they hold, and publishes on the channel `ns:leases` their new
leases (they apply them without a sync) and the ids of the replicas holding more than
their due (they sync at once).

How an upstream is divided among the replicas waiting for it: lease_division.py.
"""

from __future__ import annotations

from tokenfair.gateway.replicas.lease_division import DIVISION
from tokenfair.gateway.replicas.lua_hash import write_back

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
SYNC = (
    r"""
local ns, gw, ttl, period = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])
local leaving = ARGV[4] == '2'
local announcing = ARGV[4] ~= '0'
local recovering = ARGV[4] == '3'
local told = {}  -- id and upstream -> what to tell that replica (below)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = ns .. ':capacity'
-- The whole hash in one read; what changes is written back in one HSET at the end.
local held = {}
do
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do held[flat[j]] = flat[j + 1] end
end
local changes = {}  -- field -> new value, or false: delete it
local function set(field, value)
  value = tostring(value)
  if held[field] ~= value then
    held[field] = value
    changes[field] = value
  end
end
local function drop(field)
  if held[field] ~= nil then
    held[field] = nil
    changes[field] = false
  end
end
-- The field of replica `g`'s `kind` ('s', 't', 'c', 'claim') about `what` (an upstream
-- or a model).
local function field_of(kind, g, what)
  return kind .. '\t' .. g .. '\t' .. what
end
-- The hash read as tables: each replica's last sync, leases per upstream, turns' credit
-- per upstream, claims per model. (The replica's id comes second in a field, so that
-- two plain searches split it.)
local seen, lease, credit, claim = {}, {s = {}, t = {}}, {}, {}
local function file(by, what, g, value)
  local each = by[what]
  if each == nil then
    each = {}
    by[what] = each
  end
  each[g] = value
end
for field, value in pairs(held) do
  local tab = string.find(field, '\t', 1, true)
  if tab then
    local kind = string.sub(field, 1, tab - 1)
    local second = string.find(field, '\t', tab + 1, true)
    if second == nil then
      if kind == 'seen' then seen[string.sub(field, tab + 1)] = tonumber(value) end
    else
      local g, what = string.sub(field, tab + 1, second - 1), string.sub(field, second + 1)
      if kind == 's' or kind == 't' then
        file(lease[kind], what, g, tonumber(value))
      elseif kind == 'c' then
        file(credit, what, g, tonumber(value))
      elseif kind == 'claim' then
        file(claim, what, g, value)
      end
    end
  end
end
set('seen\t' .. gw, now)
seen[gw] = now
-- The live replicas, and the long dead to forget (every field of theirs has been
-- dropped where it was met by now).
local alive, live_count = {}, 0
for g, at in pairs(seen) do
  alive[g] = at >= now - ttl
  if alive[g] then live_count = live_count + 1 end
  if at < now - 10 * ttl then drop('seen\t' .. g) end
end
local function live(g)
  return alive[g] == true
end
-- What the other live replicas hold of one limit of an upstream (`kind` 's' or 't'):
-- the sum, and each one's; and this one's. A dead replica's lease is dropped.
local function others(kind, url)
  local sum, each, mine = 0, {}, 0
  for g, value in pairs(lease[kind][url] or {}) do
    if g == gw then
      mine = value
    elseif live(g) then
      each[g] = value
      sum = sum + value
    else
      drop(field_of(kind, g, url))
    end
  end
  return sum, each, mine
end
local function fields(text)
  local out = {}
  for field in string.gmatch(text, '[^\t]+') do out[#out + 1] = field end
  return out
end
"""
    + DIVISION
    + r"""
-- This replica's lease on one limit of an upstream. A limit of 0 (none): nothing is
-- kept in Redis, the lease is what it wants.
local function settle(field, cap, want, floor, others_hold)
  local grant = want
  if recovering and grant > floor then grant = floor end
  if cap > 0 and grant > cap - others_hold then grant = cap - others_hold end
  if grant < floor then grant = floor end
  if cap > 0 then
    if grant > 0 then set(field, grant) else drop(field) end
  end
  return grant, others_hold
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
-- A claim as the hash holds it (claim_text).
local function claim_of(text)
  local f = fields(text)
  local nodes = {}
  for k = 4, #f - 1, 2 do nodes[f[k]] = tonumber(f[k + 1]) end
  return {band = tonumber(f[1]), need_s = tonumber(f[2]), need_t = tonumber(f[3]),
    nodes = nodes}
end
-- Every live replica's claims, this one's written first.
local claims = {}  -- model -> gateway -> {band, need_s, need_t, nodes}
local claimed = false  -- a claim this replica did not have: the others hear it at once
for _ = 1, tonumber(ARGV[i]) do
  local model, mine = ARGV[i + 1], ARGV[i + 2]
  local had = (claim[model] or {})[gw]
  if mine == '' then
    drop(field_of('claim', gw, model))
  else
    set(field_of('claim', gw, model), mine)
    if had == nil then claimed = true end
  end
  local byg = {}
  if mine ~= '' then byg[gw] = claim_of(mine) end
  for g, text in pairs(claim[model] or {}) do
    if g ~= gw then
      if live(g) then byg[g] = claim_of(text) else drop(field_of('claim', g, model)) end
    end
  end
  claims[model] = byg
  i = i + 2
end

local out = {}
for _, up in ipairs(ups) do
  local held_s, each_s = 0, {}
  if up.cap_s > 0 then held_s, each_s = others('s', up.url) end
  local held_t, each_t = 0, {}
  if up.cap_t > 0 then held_t, each_t = others('t', up.url) end
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
    local function want(cap, mine_need, needs, each, turns_url)
      if cap <= 0 then return leaving and 0 or mine_need, {} end
      local due = share(cap, who, weight, needs, turns_url)
      if leaving then return 0, due end
      -- Beyond its share: what no other replica holds or is due.
      local taken = 0
      local listed = {}
      for _, g in ipairs(who) do
        if g ~= gw then
          taken = taken + math.max(each[g] or 0, due[g])
          listed[g] = true
        end
      end
      for g, h in pairs(each) do
        if not listed[g] then taken = taken + h end
      end
      if due[gw] == nil then return 0, due end
      return math.min(mine_need, math.max(due[gw], cap - taken)), due
    end
    want_s, due_s = want(up.cap_s, up.need_s, need_s, each_s, up.url)
    want_t, due_t = want(up.cap_t, up.need_t, need_t, each_t, nil)
  end
  local slots, others_slots = settle(field_of('s', gw, up.url), up.cap_s, want_s, up.floor_s, held_s)
  local tokens, others_tokens = settle(field_of('t', gw, up.url), up.cap_t, want_t, up.floor_t, held_t)
  -- Whom to tell, when capacity was given back, a claim is new or this replica
  -- leaves: a replica due more than it holds, while capacity is free, is granted it
  -- here (its lease in Redis grows, and the announcement carries the new lease: it
  -- needs no sync of its own); with a new claim, a replica holding more than its due
  -- is told to sync (it gives back as its requests end).
  local function tell(cap, due, each, free, which)
    if cap <= 0 or not (announcing or claimed) then return end
    for _, g in ipairs(who_sorted) do
      local d, h = due[g], each[g] or 0
      if d ~= nil and g ~= gw then
        local entry = told[g .. '\t' .. up.url]
        if h < d and free > 0 then
          local lease = h + math.min(d - h, free)
          free = free - (lease - h)
          set(field_of(which, g, up.url), lease)
          entry = entry or {g = g, url = up.url}
          entry[which] = lease
        elseif claimed and h > d then
          entry = entry or {g = g, url = up.url}
        end
        told[g .. '\t' .. up.url] = entry
      end
    end
  end
  tell(up.cap_s, due_s, each_s, up.cap_s - held_s - slots, 's')
  tell(up.cap_t, due_t, each_t, up.cap_t - held_t - tokens, 't')
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
-- Every change in one HSET and one HDEL.
local writes, gone = {}, {}
for field, value in pairs(changes) do
  if value then
    writes[#writes + 1] = field
    writes[#writes + 1] = value
  else
    gone[#gone + 1] = field
  end
end
"""
    + write_back("writes", "gone")
    + r"""
if #lines > 0 then
  table.sort(lines)
  redis.call('PUBLISH', ns .. ':leases', tostring(now) .. '\n' .. table.concat(lines, '\n'))
end
return out
"""
)


def claim_text(band: int, slots: int, tokens: int, nodes: dict[str, float]) -> str:
    """A replica's claim for a model, as the hash holds it (`claim <id> <model>`): its best band,
    the requests and tokens it would hold, and the nodes waiting, weighted. (No counter:
    the text stays the same while the demand does, and Redis is written only when it
    changes.)"""
    weighted = (f"{node}\t{weight!r}" for node, weight in sorted(nodes.items()))
    return "\t".join((str(band), str(slots), str(tokens), *weighted))


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
