"""The Lua scripts of :mod:`flexinfer.proxy.redisshare` and the names of the keys they use.

Owns: every Redis key name and every server-side step of the sharing across proxy replicas: the GCRA
lease of rate-limit tokens, the give-back of unused ones, the post-response charge of token limits, and the in-flight counts exchange.
Must not: talk to Redis, keep state, or know the request pipeline (plain strings and numbers only).

Each script is atomic (Redis runs one at a time) and reads the clock with ``TIME`` inside the script,
so every replica shares Redis's clock and no client clock enters a decision. The scripts write only
keys under one prefix and compute some key names inside (a dead member's): they need a single Redis
(or a primary), not Redis Cluster.

Keys (``p`` = ``PROXY_REDIS_PREFIX``):

- ``p:rl:<scope>``: one rate-limit bucket, its TAT (theoretical arrival time of GCRA) in microseconds
  of Redis ``TIME``, expiring when the bucket is full again (a missing key is a full bucket).
- ``p:if:members``: zset of the sharing workers (``<machine>\\x1f<worker>``), score = last sync (ms).
- ``p:if:w:<machine>:<worker>``: hash endpoint -> that worker's in-flight count (non-zero only).
- ``p:if:sum``: hash endpoint -> sum over every member; ``p:if:sum:<machine>``: the same over one
  machine's members; ``p:if:machines``: hash machine -> its live members (``HLEN`` = machines seen).

The sums are kept exact by the scripts themselves: a sync applies the member's change (new - old
count per endpoint) to both sums, and the janitor in every sync drops members silent for longer than
the member TTL, taking their counts out. So a sync costs O(endpoints), not O(members x endpoints), and
a Redis that lost everything (restart) is consistent again as soon as every member synced once (a
member whose key is gone re-joins with old = nothing).
"""

from __future__ import annotations

SEP = "\x1f"  # between machine and worker in a member id; refused inside either id

#: microseconds; a bucket admits when the missing part of a token would arrive within this time (the
#: local token buckets' GRACE, for the same reason: clock readings are rounded)
GRACE_US = 1.0

_NOW_US = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

#: KEYS[1] the bucket. ARGV: rate (tokens/s), burst, want, need.
#: Grants g <= the tokens in the bucket now (never more, but GRACE): up to ``want``, and 0 when fewer
#: than ``need`` are there. Returns {g (string), wait_us}: the time until ``need`` tokens are in the
#: bucket after this grant (0: they are there now).
LEASE = _NOW_US + f"""
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, need = tonumber(ARGV[3]), tonumber(ARGV[4])
local iv = 1000000 / rate
local grace = {GRACE_US} / iv
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local avail = burst - (tat - now) / iv
local g = math.floor(avail + grace)
if g > want then g = want end
if g < need then
  if avail + grace >= need then g = need else g = 0 end
end
if g > 0 then
  tat = tat + g * iv
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  avail = avail - g
end
local wait = 0
if avail + grace < need then wait = math.ceil((need - avail) * iv) end
return {{string.format('%.17g', g), wait}}
"""

#: KEYS[1] the bucket. ARGV: rate, n. Gives ``n`` unused tokens back: TAT -= n x interval, not below
#: now (a bucket is never fuller than full).
GIVE_BACK = _NOW_US + """
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat <= now then return 0 end
tat = tat - tonumber(ARGV[2]) * 1000000 / tonumber(ARGV[1])
if tat <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
return 1
"""

#: KEYS[1] the bucket. ARGV: rate, burst, n (may be negative). A charge after the fact (token
#: limits: the output tokens of a finished response, the correction of an estimate), with no
#: admission check: the same arithmetic as ``SharedBuckets.charge`` in microseconds (debt capped at
#: one burst past empty, a refund never fills past full). Returns the debt wait in microseconds.
CHARGE = _NOW_US + """
local iv = 1000000 / tonumber(ARGV[1])
local tol = tonumber(ARGV[2]) * iv
local cap = 2 * tol
local cost = tonumber(ARGV[3]) * iv
if cost > cap then cost = cap elseif cost < -cap then cost = -cap end
local tat = tonumber(redis.call('GET', KEYS[1]))
local ahead = 0
if tat ~= nil and tat > now then ahead = tat - now end
if ahead > cap then ahead = cap end
local new = ahead + cost
if new < 0 then new = 0 elseif new > cap then new = cap end
if new <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('SET', KEYS[1], string.format('%.3f', now + new), 'PX', math.ceil(new / 1000) + 1)
if new > tol then return math.ceil(new - tol) end
return 0
"""

# shared by SYNC and LEAVE: KEYS[1] members, KEYS[2] machines, KEYS[3] sum; ARGV[1] prefix
_FORGET = """
local p = ARGV[1]
local function add(key, ep, d)
  if redis.call('HINCRBY', key, ep, d) <= 0 then redis.call('HDEL', key, ep) end
end
local function forget(m)
  local sep = string.find(m, '\\31', 1, true)
  local mach, worker = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
  local wkey, mkey = p .. ':if:w:' .. mach .. ':' .. worker, p .. ':if:sum:' .. mach
  local old = redis.call('HGETALL', wkey)
  for i = 1, #old, 2 do
    add(KEYS[3], old[i], -tonumber(old[i + 1]))
    add(mkey, old[i], -tonumber(old[i + 1]))
  end
  redis.call('DEL', wkey)
  if redis.call('ZREM', KEYS[1], m) == 1 then add(KEYS[2], mach, -1) end
end
"""

#: KEYS: members, machines, sum, this machine's sum, this member's counts.
#: ARGV: prefix, member id, member TTL (ms), then endpoint, count pairs (count > 0).
#: Publishes this member's counts, drops dead members (at most 64 per call), and returns
#: {sum (flat hash), this machine's sum (flat hash), machines seen, members seen}.
SYNC = _FORGET + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, ttl = ARGV[2], tonumber(ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl, 'LIMIT', 0, 64)
for _, m in ipairs(dead) do
  if m ~= member then forget(m) end
end
if redis.call('ZADD', KEYS[1], now, member) == 1 then
  add(KEYS[2], string.sub(member, 1, string.find(member, '\\31', 1, true) - 1), 1)
end
local old = {}
local prev = redis.call('HGETALL', KEYS[5])
for i = 1, #prev, 2 do old[prev[i]] = tonumber(prev[i + 1]) end
for i = 4, #ARGV, 2 do
  local ep, n = ARGV[i], tonumber(ARGV[i + 1])
  local d = n - (old[ep] or 0)
  old[ep] = nil
  if d ~= 0 then
    add(KEYS[3], ep, d)
    add(KEYS[4], ep, d)
    redis.call('HSET', KEYS[5], ep, n)
  end
end
for ep, n in pairs(old) do
  add(KEYS[3], ep, -n)
  add(KEYS[4], ep, -n)
  redis.call('HDEL', KEYS[5], ep)
end
return {redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
        redis.call('HLEN', KEYS[2]), redis.call('ZCARD', KEYS[1])}
"""

#: KEYS: members, machines, sum. ARGV: prefix, member id. A stopping member takes its counts out now
#: (a member that dies instead is dropped by the others' janitor after the member TTL).
LEAVE = _FORGET + """
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then forget(ARGV[2]) end
return 1
"""


def bucket_key(prefix: str, scope: str) -> str:
    return f"{prefix}:rl:{scope}"


def member_id(machine: str, worker: str) -> str:
    return f"{machine}{SEP}{worker}"


def sync_keys(prefix: str, machine: str, worker: str) -> list[str]:
    """KEYS of :data:`SYNC` (the first three are those of :data:`LEAVE`)."""
    return [f"{prefix}:if:members", f"{prefix}:if:machines", f"{prefix}:if:sum",
            f"{prefix}:if:sum:{machine}", f"{prefix}:if:w:{machine}:{worker}"]


def remote_counts(total: list[str], mine: list[str]) -> dict[str, int]:
    """Per endpoint: the sum over every member minus this machine's (flat HGETALL replies)."""
    own = {mine[i]: int(mine[i + 1]) for i in range(0, len(mine), 2)}
    out: dict[str, int] = {}
    for i in range(0, len(total), 2):
        n = int(total[i + 1]) - own.get(total[i], 0)
        if n > 0:
            out[total[i]] = n
    return out
