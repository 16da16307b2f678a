"""The Lua script that merges a gateway replica's VTC counters with Redis, atomically.

Every decision is taken in the replica, on its own copy of the counters
(redis_store.py); this script, run in the background, adds what the replica changed
since its last sync and hands back what the whole fleet holds.

Keys, all under one namespace `ns`:

- `ns:counters`  hash node -> virtual counter (float): tenants, and groups as `@path`;
                 and `~epoch`, set when the hash is first written (a new one: Redis
                 lost the counters, and each replica writes back what it had)
- `ns:waiting`   hash gateway id -> "<ms>" then, a line each, the path of every tenant
                 with requests waiting there (nodes joined by tabs, top-level first);
                 the ms (Redis clock) is the replica's last sync: its liveness
- `ns:lastchild` hash group -> its child admitted last anywhere (the top level's
                 field is ''): the paper's lift reference when nothing waits below

A replica whose entry is older than the TTL is dead: the next sync of any replica drops
it, so a crashed replica cannot leave tenants "waiting" for ever. Times come from
Redis (TIME), never from the replicas' clocks. Keys are built inside the script:
single Redis or a replicated primary, not Redis Cluster.

Redis commands per sync: the script, TIME and HGETALL three times, plus HMGET and HSET
when the replica charged or lifted something, HSET or HDEL of its waiting entry when
it has one or just lost it, HSET when it admitted a request: 5 to 9, however many
requests it dispatched since its last sync.
"""

from __future__ import annotations

# ARGV: ns, gw, ttl_ms, n, (node, floor or '', charge) x n, waiting, last
#   floor: the node is raised to at least this before the charge is added (a lift);
#   waiting: the entry's lines ('' this replica has nothing waiting now, '-' nor had
#   it at its last sync: nothing to write);
#   last: '' or the path of the tenant this replica admitted last (tab-joined).
# Returns {every counter and the epoch flat, the entries of the other live replicas, the last
#   admitted children flat}.
SYNC = r"""
local ns, gw, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local counters = ns .. ':counters'
local EPOCH = '~epoch'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A number as text that reads back as the same double (tostring keeps 14 digits: a
-- lifted counter would come back above the one it was lifted to, and lose its tie).
local function exact(x)
  return string.format('%.17g', x)
end
local n = tonumber(ARGV[4])
local i = 5
-- In chunks: Lua's unpack takes a few thousand values at most.
for first = 0, n - 1, 500 do
  local last = math.min(n - 1, first + 499)
  local nodes = {}
  for k = first, last do nodes[#nodes + 1] = ARGV[i + 3 * k] end
  local current = redis.call('HMGET', counters, unpack(nodes))
  local writes = {}
  for k = first, last do
    local at = i + 3 * k
    local c = tonumber(current[k - first + 1] or '0')
    if ARGV[at + 1] ~= '' then
      local floor = tonumber(ARGV[at + 1])
      if floor > c then c = floor end
    end
    writes[#writes + 1] = ARGV[at]
    writes[#writes + 1] = exact(c + tonumber(ARGV[at + 2]))
  end
  redis.call('HSET', counters, unpack(writes))
end
i = i + 3 * n
local waiting = ns .. ':waiting'
if ARGV[i] == '' then
  redis.call('HDEL', waiting, gw)
elseif ARGV[i] ~= '-' then
  redis.call('HSET', waiting, gw, now .. '\n' .. ARGV[i])
end
local lastchild = ns .. ':lastchild'
if ARGV[i + 1] ~= '' then
  local pairs_ = {}
  local parent = ''
  for node in string.gmatch(ARGV[i + 1], '[^\t]+') do
    pairs_[#pairs_ + 1] = parent
    pairs_[#pairs_ + 1] = node
    parent = node
  end
  redis.call('HSET', lastchild, unpack(pairs_))
end
local others = {}
local flat = redis.call('HGETALL', waiting)
for j = 1, #flat, 2 do
  if flat[j] ~= gw then
    local entry = flat[j + 1]
    local cut = string.find(entry, '\n', 1, true)
    local seen = tonumber(cut and string.sub(entry, 1, cut - 1) or entry)
    if seen == nil or seen < now - ttl then
      redis.call('HDEL', waiting, flat[j])
    elseif cut then
      others[#others + 1] = string.sub(entry, cut + 1)
    end
  end
end
-- The counters' epoch: a new one when they were lost (Redis restarted empty), which
-- tells every replica to write back what it had.
local all = redis.call('HGETALL', counters)
local found = false
for j = 1, #all, 2 do
  if all[j] == EPOCH then found = true break end
end
if not found then
  redis.call('HSET', counters, EPOCH, tostring(now))
  all[#all + 1] = EPOCH
  all[#all + 1] = tostring(now)
end
return {all, others, redis.call('HGETALL', lastchild)}
"""
