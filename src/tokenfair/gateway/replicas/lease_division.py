"""How an upstream's capacity is divided among the gateway replicas waiting for it: the
part of the lease script (lease_script.py) that decides who is due what.

Among the replicas whose requests wait for an upstream (those at the best band), in
proportion to the weights waiting at each, a tenant or group waiting at n replicas
counting 1/n of its weight at each, and none above what it would hold (water-filling,
so what one cannot use goes to the others). A share's fraction of a slot is held in
turns, period by period (of `period_ms`, Redis time), by smooth weighted round robin
(the hash's `k`, `e` and `c` fields), so that over any run of periods each holds its
share to within one period's slot. The shared counters then order the tenants within
each replica, and the tenant waiting at several replicas is evened out by them.

The Lua below runs inside that script: it reads `now`, `period`, `held` and `credit`
(the hash as read) and writes through `set` and `drop` the fields `field_of` names, all
defined there.
"""

from __future__ import annotations

DIVISION = r"""
-- Which of `who` hold one more unit this period, m of them: smooth weighted round robin,
-- kept in the hash (the period, each replica's credit, the period's choice). Each period
-- every replica's credit grows by its fraction, and the m with the most (ties: the
-- first id) hold one more and lose 1 of credit: over any run of periods, each holds
-- its fractions' sum to within one. The first sync of a period chooses; the others in
-- it read the choice.
local function turns(url, who, fraction, m)
  local k = math.floor(now / period)
  local chosen = {}
  local choice = held['e\t' .. url]
  if tonumber(held['k\t' .. url]) == k and choice ~= nil then
    for g in string.gmatch(choice, '[^ ]+') do chosen[g] = true end
    return chosen
  end
  -- Credit carries over from the last period only: after a pause, every replica
  -- starts again from its fraction.
  local carry = tonumber(held['k\t' .. url]) == k - 1
  local was = credit[url] or {}
  local now_credit, order = {}, {}
  for _, g in ipairs(who) do
    now_credit[g] = (carry and was[g] or 0) + fraction[g]
    order[#order + 1] = g
  end
  table.sort(order, function(a, b)
    if now_credit[a] ~= now_credit[b] then return now_credit[a] > now_credit[b] end
    return a < b
  end)
  local names = {}
  for index, g in ipairs(order) do
    if index <= m then
      chosen[g] = true
      now_credit[g] = now_credit[g] - 1
      names[#names + 1] = g
    end
    set(field_of('c', g, url), string.format('%.17g', now_credit[g]))
  end
  for g, _ in pairs(was) do
    if now_credit[g] == nil then drop(field_of('c', g, url)) end
  end
  set('k\t' .. url, k)
  set('e\t' .. url, table.concat(names, ' '))
  return chosen
end
-- The capacity divided among `who` (sorted ids) by weight, none above its need
-- (water-filling); whole units, the fractions held in turns (`turns`, when `url` is
-- given: slots) or by the largest fractions (tokens, where one is next to nothing).
local function share(cap, who, weight, need, url)
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
  if url ~= nil then
    extra = turns(url, who, fraction, m)
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
"""
