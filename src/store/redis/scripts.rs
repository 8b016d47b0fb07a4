//! The Lua scripts of every operation. Each runs atomically on the server and
//! touches only keys of one hash slot (the record and its scope's index share
//! a hash tag), so every script is single-slot on a Cluster.
//!
//! Times come from the server: `TIME` for a claim's lock expiry, index scores
//! and token floors, key TTLs (`PEXPIRE`) for how long a record is kept. The
//! application's clock is never sent or compared.
//!
//! A record is a hash: `sc` scope, `k` key, `fp` fingerprint, `tok` fencing
//! token, `st` state (`p` in progress, `c` completed, `u` completed without a
//! replayable response, `r` released: a short-lived tombstone that only keeps
//! the last token), `lx` for `p` the lock's expiry in server milliseconds,
//! `n` the claim's attempt (1, or one more than the dead claim it took over)
//! and `bg` when it was made in server milliseconds,
//! `w` set once a waiter checked the claim (only then do `complete` and
//! `release` publish), `iw` how far past its key's expiry the claim scored
//! its index entry (ms), `ph` once a request recorded (or resumed) phases
//! under the record (carried to the claim that takes it over), and for `c`
//! the response: `status`, `hd`, `bd`. A first attempt has no `n` (read as
//! 1). `lx` and `iw` stay after the completion: only a claim's are read.
//!
//! A claim's key lives for its lock plus the retention (`keep`), past its
//! lock: a claim whose lock ran out stays its owner's until a `begin` takes
//! it over, so a late `extend` or `complete` with no takeover in between
//! succeeds, as on the other stores. Only `begin` judges `lx`.
//!
//! A completed record leaves a tombstone: a string of its own, the 32-byte
//! fingerprint then the scope (the key is in its name; a string that short
//! is stored inline with its header), beside the record in the same slot,
//! written with the completion and kept for the retention plus the
//! tombstone window by its own TTL. The record (and its response) expires at
//! the retention as before; until the tombstone expires too, `begin` answers
//! `expired` to its fingerprint and `mismatch` to another.
//! The index is a sorted set of the scope's keys scored by (at least) their
//! key's expiry in server milliseconds, for `purge_scope`; it expires no
//! earlier than its highest score. A claim scores its entry past its key's
//! expiry by the tombstone window (`iw`), so that a completion within the
//! lock, whose tombstone expires no later, leaves the entry as it is. Two
//! marker entries (`''` and `'.'`) tell claims whether the index's TTL was
//! checked in the current bucket of time (see `claim_index`).

use redis::Script;

/// The functions the scripts share, each script taking only those it calls
/// (a function defined is a closure made on every run): the server's time
/// in milliseconds, and an index (a scope's, or its phase index) kept at
/// least as long as the record it names (`ttl` ms from now). `index` sets a
/// phase index's TTL a sixteenth further than needed, so that the records
/// that follow find it long enough and leave it; `claim_index` checks a scope
/// index's once per sixteenth. The hot paths hand `redis.call` strings, not
/// numbers: a number argument is formatted with `%.17g`, which costs more
/// than the command it is for.
const NOW_MS: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// See [`NOW_MS`].
const CLAIM_INDEX: &str = r#"
-- A claim's entry. Its index is kept until the end of the current bucket
-- (a sixteenth of `ttl`) plus `ttl`, and its TTL checked once per bucket:
-- two marker entries (`''` and `'.'`, never keys: keys have 8 bytes or
-- more) are scored that far by the same `ZADD`, which counts them (2) only
-- when a claim moves them to a new bucket (or they were gone), and that
-- claim checks. They move together: removed only together (by score, or
-- with the whole index; `purge_scope` leaves them), so a count of 0 or 1
-- (the key's own entry) means a claim of this bucket checked already.
-- `at` is `now` as a string.
local function claim_index(idx, member, ttl, now, at, trim)
  if trim then redis.call('ZREMRANGEBYSCORE', idx, '-inf', at) end
  local bucket = math.floor(ttl / 16) + 1
  local horizon = (math.floor(now / bucket) + 1) * bucket + ttl
  local mark = string.format('%d', horizon)
  local changed = redis.call('ZADD', idx, 'CH', string.format('%d', now + ttl), member, mark, '',
    mark, '.')
  if changed >= 2 and redis.call('PTTL', idx) < horizon - now then
    redis.call('PEXPIRE', idx, horizon - now)
  end
end
"#;

/// See [`NOW_MS`].
const INDEX: &str = r#"
local function index(idx, member, ttl, now, trim)
  -- The entries of expired records go (each is removed once) when `trim`.
  if trim then redis.call('ZREMRANGEBYSCORE', idx, '-inf', now) end
  redis.call('ZADD', idx, now + ttl, member)
  if redis.call('PTTL', idx) < ttl then
    redis.call('PEXPIRE', idx, ttl + math.floor(ttl / 16))
  end
end
"#;

/// See [`NOW_MS`].
const REINDEX: &str = r#"
-- An entry's score only grows (GT): a record's expiry that comes before its
-- entry's score needs no update, and the index already outlives that score.
local function reindex(idx, member, ttl, now)
  if redis.call('ZADD', idx, 'GT', 'CH', now + ttl, member) == 1 and
      redis.call('PTTL', idx) < ttl then
    redis.call('PEXPIRE', idx, ttl)
  end
end
"#;

/// See [`NOW_MS`].
const SAME_RECORD: &str = r#"
local function same_record(v)
  -- Two identities on one key name (a hash collision of scopes): refused.
  if v[1] ~= ARGV[1] or v[2] ~= ARGV[2] then
    return redis.error_reply('tower-idempotency: two records share one key name')
  end
end
"#;

/// KEYS: record, index, tombstone. ARGV: scope, key, fingerprint; the
/// store's lock, keep, index and `iw` ms are [`Constants`] (the index entry
/// is scored keep plus the tombstone window ahead: it then already covers a
/// completion within the lock, which leaves it).
/// Replies `{'claimed', token}` (`{'claimed', token, attempt,
/// previous token, previous start ms}` for a takeover of a dead claim),
/// `{'replay', status, headers, body, ttl ms}`, `{'mismatch'}`,
/// `{'unavailable', ttl ms}`, `{'expired'}` (a tombstone) or
/// `{'in_progress', remaining lock ms}`; a completed record's remaining TTL
/// bounds its near cache entry.
const BEGIN: &str = r#"
local rec, idx = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'fp', 'st', 'tok', 'status', 'hd', 'bd', 'lx',
  'n', 'bg', 'ph')
local t = redis.call('TIME')
-- The server's clock in microseconds and in milliseconds, written from its
-- digits (no formatting of numbers).
local us = t[2]
us = string.rep('0', 6 - #us) .. us
local at = t[1] .. string.sub(us, 1, 3)
local now = tonumber(at)
local attempt, previous, began = 1, nil, nil
-- At least the server's clock in microseconds (exact in a Lua double until
-- the year 2255), so tokens keep growing after a record expired and is gone.
local token = t[1] .. us
if not v[4] or v[4] == 'r' then
  -- No record (or a released claim): a tombstone of this scope's key, if
  -- any, still holds the key.
  local tomb = redis.call('GET', KEYS[3])
  if tomb and string.sub(tomb, 33) == ARGV[1] then
    if string.sub(tomb, 1, 32) ~= ARGV[3] then return {'mismatch'} end
    return {'expired'}
  end
end
if v[4] then
  local collision = same_record(v)
  if collision then return collision end
  local lx = tonumber(v[9])
  -- A claim past its lock is free: taken over (any request), above its token.
  local expired = v[4] == 'p' and lx and lx <= now
  if v[4] ~= 'r' and not expired then
    if v[3] ~= ARGV[3] then return {'mismatch'} end
    if v[4] == 'c' then return {'replay', v[6], v[7], v[8], redis.call('PTTL', rec)} end
    if v[4] == 'u' then return {'unavailable', redis.call('PTTL', rec)} end
    return {'in_progress', lx and (lx - now) or redis.call('PTTL', rec)}
  end
  local floor = tonumber(v[5])
  if floor >= tonumber(token) then token = string.format('%d', floor + 1) end
  if expired then
    -- A dead claim: the count goes on. A claim without `bg` (made by an
    -- earlier version) began no later than its token, in microseconds.
    attempt = (tonumber(v[10]) or 1) + 1
    previous = v[5]
    began = v[11] or string.format('%d', math.floor(floor / 1000))
  end
  -- A tombstone's or an expired claim's other fields go.
  redis.call('DEL', rec)
end
redis.call('HSET', rec, 'sc', ARGV[1], 'k', ARGV[2], 'fp', ARGV[3], 'tok', token, 'st', 'p',
  'lx', string.format('%d', now + LOCK), 'bg', at, 'iw', IW)
-- A first attempt's `n` is read as 1 when absent. The phases of the claim
-- it replaces, if any, are the key's: its completion deletes them.
if attempt > 1 then redis.call('HSET', rec, 'n', string.format('%d', attempt)) end
if v[12] then redis.call('HSET', rec, 'ph', '1') end
redis.call('PEXPIRE', rec, KEEP)
claim_index(idx, ARGV[2], INDEXED, now, at, now % 8 == 0)
if previous then return {'claimed', token, attempt, previous, began} end
return {'claimed', token}
"#;

/// KEYS: record, index, tombstone, phases. ARGV: scope, key, token, state
/// (`c` or `u`), then for `c`: status, headers, body; the store's retention,
/// tombstone window (0: none), their sum and its channel are [`Constants`].
/// Replies 1, or 0 when the token does not hold the claim (its lock may have
/// run out: only a takeover, which changes the token, fences it). The key's
/// recovery points, if a request recorded any under the record (`ph`), are
/// deleted: the key is done (their index entry goes at `purge_scope`). A
/// waiter is told the record's name.
const COMPLETE: &str = r#"
local rec, idx = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'w', 'fp', 'iw', 'ph')
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return 0 end
local collision = same_record(v)
if collision then return collision end
if ARGV[4] == 'c' then
  redis.call('HSET', rec, 'st', 'c', 'status', ARGV[5], 'hd', ARGV[6], 'bd', ARGV[7])
else
  redis.call('HSET', rec, 'st', 'u')
end
-- `lx` stays: only a claim's (`p`) is ever read.
-- The claim scored its index entry `iw` past its key's expiry; the entry
-- must last as long as the tombstone (retention plus window), for
-- `purge_scope`. With `iw` the window, the entry covers it while the key's
-- expiry is at least the retention away (its lock has not run out): then
-- `PEXPIRE ... LT` both shortens the key to the retention and says so. A
-- claim of another window (or without `iw`: an earlier version) reads
-- `PTTL`.
local covered
if v[7] == WINDOW then
  covered = redis.call('PEXPIRE', rec, RETENTION, 'LT') == 1
  if not covered then redis.call('PEXPIRE', rec, RETENTION) end
else
  covered = v[7] and redis.call('PTTL', rec) + tonumber(v[7]) >= tonumber(KEPT)
  redis.call('PEXPIRE', rec, RETENTION)
end
if v[8] then redis.call('DEL', KEYS[4]) end
if WINDOW ~= '0' then redis.call('SET', KEYS[3], v[6] .. ARGV[1], 'PX', KEPT) end
if not covered then reindex(idx, ARGV[2], tonumber(KEPT), now_ms()) end
if v[5] then redis.call('PUBLISH', CHANNEL, rec) end
return 1
"#;

/// KEYS: record, index, phases, phase index. ARGV: scope, key, token, lock
/// ms, keep ms, index ms (as `BEGIN`'s), phases' keep ms. Replies 1, or 0
/// when the token does not hold the claim; a claim past its lock that nobody
/// took over is held again. The claim's request's phase hash, if any, lives
/// on with it.
const EXTEND: &str = r#"
local rec, idx = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'fp')
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return 0 end
local collision = same_record(v)
if collision then return collision end
local keep = tonumber(ARGV[5])
local now = now_ms()
redis.call('HSET', rec, 'lx', string.format('%d', now + tonumber(ARGV[4])),
  'iw', string.format('%d', tonumber(ARGV[6]) - keep))
redis.call('PEXPIRE', rec, keep)
reindex(idx, ARGV[2], tonumber(ARGV[6]), now)
if redis.call('HGET', KEYS[3], 'fp') == v[5] then
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
  index(KEYS[4], ARGV[2], tonumber(ARGV[7]), now, false)
end
return 1
"#;

/// KEYS: record, index. ARGV: scope, key, token, channel, id. The record
/// becomes a tombstone for a second: a claim right after it still draws a
/// higher token. Replies 1 or 0.
const RELEASE: &str = r#"
local rec, idx = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'w')
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return 0 end
local collision = same_record(v)
if collision then return collision end
redis.call('HDEL', rec, 'fp', 'lx')
redis.call('HSET', rec, 'st', 'r')
redis.call('PEXPIRE', rec, 1000)
redis.call('ZREM', idx, ARGV[2])
if v[5] then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
return 1
"#;

/// KEYS: record, tombstone. ARGV: scope, key. Replies `{'absent'}`, `{'p',
/// token, attempt, began ms, lock expiry ms}`, `{'c', status, body bytes,
/// expiry ms}`, `{'u', expiry ms}` or `{'x', tombstone expiry ms}`, times in
/// server milliseconds. A record of
/// another identity on the key name is absent: never shown across scopes.
const INSPECT: &str = r#"
local v = redis.call('HMGET', KEYS[1], 'sc', 'k', 'st', 'tok', 'n', 'bg', 'lx', 'status')
local now = now_ms()
if not v[3] or v[3] == 'r' or v[1] ~= ARGV[1] or v[2] ~= ARGV[2] then
  local tomb = redis.call('GET', KEYS[2])
  if tomb and string.sub(tomb, 33) == ARGV[1] then
    return {'x', string.format('%d', now + redis.call('PTTL', KEYS[2]))}
  end
  return {'absent'}
end
local expiry = now + redis.call('PTTL', KEYS[1])
if v[3] == 'p' then
  return {'p', v[4], v[5] or '1', v[6] or '0', v[7] or string.format('%d', expiry)}
end
if v[3] == 'c' then
  local size = redis.call('HSTRLEN', KEYS[1], 'bd')
  return {'c', v[8], string.format('%d', size), string.format('%d', expiry)}
end
return {'u', string.format('%d', expiry)}
"#;

/// KEYS: record, index. ARGV: scope, key, token, channel, id, a tenth of the
/// lock in ms. `RELEASE` for an operator: replies 1 (released), 2 (the token
/// owns the claim but more than a tenth of its lock is left: its owner may be
/// alive), 0 (the token does not own the claim) or -1 (no record of the
/// key).
const RELEASE_STUCK: &str = r#"
local rec, idx = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'w', 'lx')
if not v[4] or v[4] == 'r' or v[1] ~= ARGV[1] or v[2] ~= ARGV[2] then return -1 end
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return 0 end
local now = now_ms()
local lx = tonumber(v[6]) or (now + redis.call('PTTL', rec))
if lx - now > tonumber(ARGV[6]) then return 2 end
redis.call('HDEL', rec, 'fp', 'lx')
redis.call('HSET', rec, 'st', 'r')
redis.call('PEXPIRE', rec, 1000)
redis.call('ZREM', idx, ARGV[2])
if v[5] then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
return 1
"#;

/// KEYS: record. Replies the lock's remaining milliseconds, or -1 when the
/// record is not in progress or its lock ran out (a `begin` then takes it
/// over), and marks the claim as waited for: its completion or release then
/// publishes. A waiter registers for the message before this check, so a
/// completion after it is heard and one before it is seen by it; a claim
/// nobody waits for publishes nothing.
const LOCK_REMAINING: &str = r#"
local v = redis.call('HMGET', KEYS[1], 'st', 'lx')
if v[1] ~= 'p' then return -1 end
local lx = tonumber(v[2])
local remaining = lx and (lx - now_ms()) or redis.call('PTTL', KEYS[1])
if remaining <= 0 then return -1 end
redis.call('HSET', KEYS[1], 'w', '1')
return remaining
"#;

/// KEYS: index, then the record, the tombstone and the phase hash of each
/// member. ARGV: scope, then the members (`ARGV[i]` names `KEYS[3i - 4]`,
/// `KEYS[3i - 3]` and `KEYS[3i - 2]`). Deletes the records, tombstones and
/// phase hashes of `scope` and their index entries, and the entries of
/// records already gone; entries of another scope sharing the hash tag
/// stay, as do the claims' bucket markers. Deleting a record's phases with
/// it leaves none that a claim recorded after the phase pass ran. Replies `{deleted, entries removed}`:
/// a key counts once, whether its record, its tombstone or both went.
const PURGE_SCOPE: &str = r#"
local deleted, removed = 0, 0
for i = 2, #ARGV do
  local rec, tomb, ph = KEYS[3 * i - 4], KEYS[3 * i - 3], KEYS[3 * i - 2]
  local v = redis.call('HMGET', rec, 'sc', 'st')
  -- The claims' bucket markers stay (see `claim_index`).
  if ARGV[i] ~= '' and ARGV[i] ~= '.' and (v[1] == ARGV[1] or not v[1]) then
    local gone = v[1] and v[2] ~= 'r'
    if gone then redis.call('DEL', rec) end
    if redis.call('HGET', ph, 'sc') == ARGV[1] then redis.call('DEL', ph) end
    local t = redis.call('GET', tomb)
    if t and string.sub(t, 33) == ARGV[1] then
      redis.call('DEL', tomb)
      gone = true
    end
    if gone then deleted = deleted + 1 end
    redis.call('ZREM', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
return {deleted, removed}
"#;

/// KEYS: record, phases, phase index. ARGV: scope, key, token. Replies
/// `{0}` when the token does not hold the claim, else `{1, name, output,
/// ...}`: the phases recorded by the claim's request (`fp`), none when the
/// hash is another request's. Marks the record (`ph`) when there are some.
const PHASES: &str = r#"
local rec, ph = KEYS[1], KEYS[2]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'fp', 'ph')
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return {0} end
local collision = same_record(v)
if collision then return collision end
local out = {1}
local p = redis.call('HMGET', ph, 'sc', 'k', 'fp')
if p[1] ~= ARGV[1] or p[2] ~= ARGV[2] or p[3] ~= v[5] then return out end
-- The request's own phases (kept past an earlier record of the key): its
-- completion deletes them.
if not v[6] then redis.call('HSET', rec, 'ph', '1') end
local all = redis.call('HGETALL', ph)
for i = 1, #all, 2 do
  local name = string.match(all[i], '^o:(.*)$')
  if name then
    out[#out + 1] = name
    out[#out + 1] = all[i + 1]
  end
end
return out
"#;

/// KEYS: record, phases, phase index. ARGV: scope, key, token, phase,
/// output, keep ms. Replies `{0}` when the token does not hold the claim,
/// `{1}` once the output is recorded, `{2, earlier output}` when the
/// request recorded the phase before, `{3}` when the hash is another
/// request's (the key's earlier one, released): kept for its retry until it
/// expires. The hash lives for the lock plus the retention plus the
/// tombstone window from its last record; its scope's phase index names
/// it, for `purge_scope`.
const RECORD_PHASE: &str = r#"
local rec, ph, pidx = KEYS[1], KEYS[2], KEYS[3]
local v = redis.call('HMGET', rec, 'sc', 'k', 'tok', 'st', 'fp', 'ph')
if v[4] ~= 'p' or v[3] ~= ARGV[3] then return {0} end
local collision = same_record(v)
if collision then return collision end
local p = redis.call('HMGET', ph, 'sc', 'k', 'fp')
if p[1] and (p[1] ~= ARGV[1] or p[2] ~= ARGV[2] or p[3] ~= v[5]) then
  -- Another request's, unexpired (its TTL): kept for its retry.
  return {3}
end
-- The record says it has phases: its completion deletes them.
if not v[6] then redis.call('HSET', rec, 'ph', '1') end
if not p[1] then
  redis.call('HSET', ph, 'sc', ARGV[1], 'k', ARGV[2], 'fp', v[5])
else
  local earlier = redis.call('HGET', ph, 'o:' .. ARGV[4])
  if earlier then return {2, earlier} end
end
redis.call('HSET', ph, 'o:' .. ARGV[4], ARGV[5])
local keep = tonumber(ARGV[6])
redis.call('PEXPIRE', ph, keep)
index(pidx, ARGV[2], keep, now_ms(), true)
return {1}
"#;

/// KEYS: phase index, then phase hashes of its members. ARGV: scope, then
/// the members (`ARGV[i]` names `KEYS[i]`). Deletes the hashes of `scope`
/// and their entries, and the entries of hashes already gone. Replies how
/// many entries it removed.
const PURGE_SCOPE_PHASES: &str = r#"
local removed = 0
for i = 2, #KEYS do
  local sc = redis.call('HGET', KEYS[i], 'sc')
  if sc == ARGV[1] or not sc then
    if sc then redis.call('DEL', KEYS[i]) end
    redis.call('ZREM', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
"#;

/// KEYS: index. Removes the entries of expired records (and the claims' bucket
/// markers once past); replies how many.
const TRIM_INDEX: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
"#;

/// What `begin` and `complete`, the scripts of every fresh request, take
/// from the store's settings, written into their source as constants: an
/// argument costs the server a string made for each run, a constant
/// nothing. Numbers are written as decimal digits.
pub(super) struct Constants<'a> {
    /// The lock, ms.
    pub(super) lock: u64,
    /// How long a claim's key is kept, ms.
    pub(super) keep: u64,
    /// How far ahead a claim scores its index entry, ms (at least `keep`).
    pub(super) indexed: u64,
    /// The retention, ms.
    pub(super) retention: u64,
    /// The tombstone window, ms.
    pub(super) window: u64,
    /// The channel completions are published on: a validated prefix and
    /// `:done`, safe between single quotes.
    pub(super) channel: &'a str,
}

/// The scripts of one store, hashed once.
pub(super) struct Scripts {
    pub(super) begin: Script,
    pub(super) complete: Script,
    pub(super) extend: Script,
    pub(super) release: Script,
    pub(super) lock_remaining: Script,
    pub(super) inspect: Script,
    pub(super) release_stuck: Script,
    pub(super) purge_scope: Script,
    pub(super) trim_index: Script,
    pub(super) phases: Script,
    pub(super) record_phase: Script,
    pub(super) purge_scope_phases: Script,
}

impl Scripts {
    pub(super) fn new(c: &Constants<'_>) -> Self {
        let with = |shared: &[&str], body: &str| Script::new(&format!("{}{body}", shared.concat()));
        let begin = format!(
            "local LOCK, KEEP, INDEXED, IW = {}, '{}', {}, '{}'\n",
            c.lock,
            c.keep,
            c.indexed,
            c.indexed.saturating_sub(c.keep)
        );
        let complete = format!(
            "local RETENTION, WINDOW, KEPT, CHANNEL = '{}', '{}', '{}', '{}'\n",
            c.retention,
            c.window,
            c.retention.saturating_add(c.window),
            c.channel
        );
        Self {
            begin: with(&[&begin, SAME_RECORD, CLAIM_INDEX], BEGIN),
            complete: with(&[&complete, SAME_RECORD, NOW_MS, REINDEX], COMPLETE),
            extend: with(&[SAME_RECORD, NOW_MS, INDEX, REINDEX], EXTEND),
            release: with(&[SAME_RECORD], RELEASE),
            lock_remaining: with(&[NOW_MS], LOCK_REMAINING),
            inspect: with(&[NOW_MS], INSPECT),
            release_stuck: with(&[NOW_MS], RELEASE_STUCK),
            purge_scope: Script::new(PURGE_SCOPE),
            trim_index: Script::new(TRIM_INDEX),
            phases: with(&[SAME_RECORD], PHASES),
            record_phase: with(&[SAME_RECORD, NOW_MS, INDEX], RECORD_PHASE),
            purge_scope_phases: Script::new(PURGE_SCOPE_PHASES),
        }
    }
}
