"""The Lua script that merges a gateway replica's VTC counters with Redis, atomically.

Every decision is taken in the replica, on its own copy of the counters
(redis_store.py); this script, run in the background, adds what the replica changed
since its last sync and hands back what the whole fleet holds.

One key, the hash `ns:vtc` (namespace `ns`), so that a sync reads it once and
writes it once:

- node -> virtual counter (float): tenants, and groups as `@path`;
- `~epoch`, set when the hash is first written (a new one: Redis lost the counters, and
  each replica writes back what it had);
- `~w:<gateway id>` -> "<ms>" then, a line each, the path of every tenant with requests
  waiting at that replica (nodes joined by tabs, top-level first); the ms (Redis clock)
  is when the replica last wrote it: its liveness;
- `~l:<group>` -> its child admitted last anywhere (the top level's group is ''): the
  paper's lift reference when nothing waits.

Tenant and group names never begin with `~` (edge/tenants.py). A replica whose entry is
older than the TTL is dead: the next sync of any replica drops it, so a crashed replica
cannot leave tenants "waiting" for ever. A replica rewrites an unchanged entry only to
keep it well within the TTL. Times come from Redis (TIME), never from the replicas'
clocks. The key is built inside the script: single Redis or a replicated primary, not
Redis Cluster.

Redis commands per sync: the script, TIME and HGETALL; then one HSET when the replica
charged, lifted, admitted or changed its waiting entry, and one HDEL when an entry
goes: 3 to 5, however many requests it dispatched since its last sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenfair.gateway.replicas.lua_hash import write_back

# The hash's own fields (module doc); tenant and group names never begin with `~`.
EPOCH, WAITING, LAST = "~epoch", "~w:", "~l:"

# ARGV: ns, gw, ttl_ms, n, (node, floor or '', charge) x n, waiting, last
#   floor: the node is raised to at least this before the charge is added (a lift);
#   waiting: the entry's lines ('' this replica has nothing waiting now, '-' nothing to
#   write: the entry is as Redis has it, or it had none and has none);
#   last: '' or the path of the tenant this replica admitted last (tab-joined).
# Returns {the hash as read (flat), what this sync wrote (flat), what it dropped, Redis's
#   time (ms)}: the replica reads the counters, the others' entries and the last admitted
#   from them (redis_store.py), so that Redis spends nothing sorting them.
SYNC = (
    r"""
local ns, gw, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local key = ns .. ':vtc'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A number as text that reads back as the same double (tostring keeps 14 digits: a
-- lifted counter would come back above the one it was lifted to, and lose its tie).
local function exact(x)
  return string.format('%.17g', x)
end
local flat = redis.call('HGETALL', key)
local at = {}  -- field -> where its value is in `flat`
for j = 1, #flat, 2 do at[flat[j]] = j + 1 end
local function held(field)
  local j = at[field]
  return j and flat[j]
end
local writes, drops = {}, {}
local function write(field, value)
  writes[#writes + 1] = field
  writes[#writes + 1] = value
end
local n = tonumber(ARGV[4])
local i = 5
for k = 0, n - 1 do
  local node = i + 3 * k
  local c = tonumber(held(ARGV[node]) or '0')
  if ARGV[node + 1] ~= '' then
    local floor = tonumber(ARGV[node + 1])
    if floor > c then c = floor end
  end
  write(ARGV[node], exact(c + tonumber(ARGV[node + 2])))
end
i = i + 3 * n
local mine = '~w:' .. gw
if ARGV[i] == '' then
  if at[mine] then drops[#drops + 1] = mine end
elseif ARGV[i] ~= '-' then
  write(mine, now .. '\n' .. ARGV[i])
end
if ARGV[i + 1] ~= '' then
  local parent = ''
  for node in string.gmatch(ARGV[i + 1], '[^\t]+') do
    if held('~l:' .. parent) ~= node then write('~l:' .. parent, node) end
    parent = node
  end
end
-- The counters' epoch: a new one when they were lost (Redis restarted empty), which
-- tells every replica to write back what it had.
if not at['~epoch'] then write('~epoch', tostring(now)) end
-- The other replicas' entries older than the TTL: those replicas are dead.
for j = 1, #flat, 2 do
  local field = flat[j]
  if string.byte(field, 1) == 126 and string.sub(field, 2, 3) == 'w:' and field ~= mine then
    local entry = flat[j + 1]
    local cut = string.find(entry, '\n', 1, true)
    local seen = tonumber(cut and string.sub(entry, 1, cut - 1) or entry)
    if seen == nil or seen < now - ttl then drops[#drops + 1] = field end
  end
end
"""
    + write_back("writes", "drops")
    + r"""
return {flat, writes, drops, now}
"""
)


@dataclass(frozen=True, slots=True)
class Merged:
    """What a merge brought back, read from the hash as the script left it."""

    counters: dict[str, float]  # node -> counter, every replica's charges included
    epoch: str  # the counters' (a new one: Redis lost them)
    elsewhere: dict[str, tuple[str, ...]]  # tenant -> its path, waiting at another live replica
    last_children: dict[str, str]  # group -> its child admitted last anywhere ('' the top)
    entry_kept: bool  # Redis holds this replica's waiting entry


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_answer(answer: list[Any], gateway_id: str) -> Merged:
    """The merge's answer ({as read, written, dropped, now}) as the hash now is."""
    read, written, dropped = answer[0], answer[1], answer[2]
    fields = {_text(read[i]): _text(read[i + 1]) for i in range(0, len(read), 2)}
    fields.update({_text(written[i]): _text(written[i + 1]) for i in range(0, len(written), 2)})
    for field in dropped:
        fields.pop(_text(field), None)
    mine = WAITING + gateway_id
    counters: dict[str, float] = {}
    elsewhere: dict[str, tuple[str, ...]] = {}
    last: dict[str, str] = {}
    for field, value in fields.items():
        if not field.startswith("~"):
            counters[field] = float(value)
        elif field.startswith(WAITING) and field != mine:
            for line in value.split("\n")[1:]:  # after the time it was written
                if line:
                    nodes = tuple(line.split("\t"))
                    elsewhere[nodes[-1]] = nodes
        elif field.startswith(LAST):
            last[field.removeprefix(LAST)] = value
    return Merged(counters, fields.get(EPOCH, ""), elsewhere, last, mine in fields)
