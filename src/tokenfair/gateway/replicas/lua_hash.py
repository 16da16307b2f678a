"""The Lua both replica scripts end with: what they changed in their hash, written
back in one HSET and one HDEL (lua.py merges the counters, lease_script.py settles the
leases; each reads its hash once with HGETALL and writes it once with this)."""

from __future__ import annotations


def write_back(writes: str, removals: str) -> str:
    """Lua writing the flat list `writes` (field, value, field, value...) to the hash
    `key` and deleting the fields listed in `removals`."""
    return f"""
-- In chunks: Lua's unpack takes a few thousand values at most.
for first = 1, #{writes}, 1000 do
  redis.call('HSET', key, unpack({writes}, first, math.min(#{writes}, first + 999)))
end
for first = 1, #{removals}, 1000 do
  redis.call('HDEL', key, unpack({removals}, first, math.min(#{removals}, first + 999)))
end
"""
