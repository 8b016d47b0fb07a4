//! The SQL of every operation, built once per store from its validated names.
//!
//! Durations are embedded as integer millisecond literals and every timestamp
//! is computed with the database's `now()`: the application's clock is never
//! sent to or compared with the database.

use std::time::Duration;

/// Rows deleted per `purge_expired` statement.
pub(super) const PURGE_BATCH: u64 = 1000;

/// Whether `name` is a plain lower-case SQL identifier: `[a-z_][a-z0-9_]{0,62}`.
pub(crate) fn is_identifier(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
}

/// `table` + `suffix`, shortened (with a hash of the table name, so that two long
/// table names sharing a prefix stay distinct) to PostgreSQL's 63-byte limit.
pub(crate) fn derived_name(table: &str, suffix: &str) -> String {
    let full = format!("{table}_{suffix}");
    if full.len() <= 63 {
        return full;
    }
    let hash = &super::hex_sha256(table.as_bytes())[..8];
    let keep = 63 - suffix.len() - hash.len() - 2;
    format!("{}_{hash}_{suffix}", &table[..keep])
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .min(i64::MAX as u64 / 1000)
}

/// Statement texts of one store.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) migrations: Vec<String>,
    pub(super) begin: String,
    /// `begin` in transactional mode: also takes the scope's lock, shared,
    /// for the transaction's life, and returns the transaction's id. Writes
    /// the claim row: used when the transaction is not READ COMMITTED.
    pub(super) begin_locked: String,
    /// Transactional mode, READ COMMITTED: takes the scope's lock (shared)
    /// and the key's for the transaction's life, then answers what `begin`
    /// answers for the key on a snapshot taken after the lock, its claim
    /// written nowhere (one call of the table's claim function).
    pub(super) claim_key: String,
    /// The completion of a claim `claim_key` made over nothing: the
    /// record's only write.
    pub(super) record_locked: String,
    pub(super) record_locked_unavailable: String,
    /// Registers a waiter of key (`$1`, `$2`) on the listener's session:
    /// whether it did (false: a completion of the key is committing).
    pub(super) register_waiter: String,
    /// Undoes one `register_waiter` of the key on the same session.
    pub(super) unregister_waiter: String,
    /// The completion of a claim `claim_key` made over an expired row.
    pub(super) replace_locked: String,
    pub(super) replace_locked_unavailable: String,
    pub(super) complete: String,
    pub(super) extend: String,
    pub(super) complete_unavailable: String,
    pub(super) complete_locked_unavailable: String,
    pub(super) release: String,
    /// A key's state for an operator (see `Inspect`).
    pub(super) inspect: String,
    /// An operator's release: `release`, answering whether it released and
    /// whether the key has a record at all.
    pub(super) release_stuck: String,
    pub(super) lock_remaining: String,
    pub(super) lock_claim: String,
    pub(super) complete_locked: String,
    pub(super) purge: String,
    /// One batch of `purge`, of at most `$1` rows (a bigint).
    pub(super) purge_batch: String,
    pub(super) purge_scope: String,
    /// Takes the scope's lock, exclusive, for the purge's transaction.
    pub(super) lock_scope: String,
    pub(super) listen: String,
    /// The channel of the store's wake-ups.
    pub(super) channel: String,
    /// Tells every instance's listener that records were purged.
    pub(super) notify_purge: String,
    /// Wakes a key's waiters (`$1`: its id). Never in a transaction that
    /// writes: PostgreSQL serialises the commits of notifying transactions
    /// (one global lock, held through the commit's WAL flush), so a NOTIFY
    /// beside the completion would make every completion wait for the
    /// previous one's disk write. Alone, it commits without a flush.
    pub(super) notify: String,
    /// The phases recorded by the request `$3` holds the claim of: a first
    /// row `(NULL, NULL)` when it does (none: the claim is lost), then
    /// `(phase, output)` for each.
    pub(super) phases: String,
    /// Records phase `$4` with output `$5` under the claim `$3`: whether the
    /// token owns the claim, whether the output was written, the output of
    /// the request's earlier record of that phase, and whether another
    /// request's unexpired phases refused it. Renews the request's other
    /// phases (kept for the lock, the retention and the tombstone window
    /// from the last record). Locks the claim's row
    /// (shared) until the transaction ends: in a local phase's transaction,
    /// no takeover commits between this check and the commit.
    pub(super) record_phase: String,
    /// Deletes the phases of scope `$1`.
    pub(super) purge_scope_phases: String,
}

/// The payload of a purge's notification (a key's wake-up is a hex id).
pub(super) const PURGED: &str = "purged";

impl Sql {
    pub(super) fn new(
        schema: &str,
        table: &str,
        channel: &str,
        lock: Duration,
        retention: Duration,
        colliding_key_locks: bool,
        tombstone: Duration,
    ) -> Self {
        // Names were validated as `[a-z_][a-z0-9_]*`; quoting also keeps reserved words usable.
        let t = format!(r#""{schema}"."{table}""#);
        let seq_name = derived_name(table, "token_seq");
        let seq = format!(r#""{schema}"."{seq_name}""#);
        let index = derived_name(table, "expires_at_idx");
        let state_check = derived_name(table, "state_check");
        let response_check = derived_name(table, "response_check");
        let phases_name = derived_name(table, "phases");
        let p = format!(r#""{schema}"."{phases_name}""#);
        let phases_index = derived_name(table, "phases_expires_at_idx");
        let claim_function = derived_name(table, "claim");
        let lock_ms = millis(lock);
        let phase_keep_ms = millis(lock.saturating_add(retention).saturating_add(tombstone));
        let retention_ms = millis(retention);
        let tombstone_ms = millis(tombstone);
        // Until when a row holds its key: a completed row for its tombstone
        // window past its retention (`expires_at`), any other row until its
        // `expires_at` (a tombstone's is its window's end). Every expiry is
        // the database's clock; with no window it is `expires_at` itself.
        let until = |r: &str| {
            format!(
                "(CASE WHEN {r}state IN ('completed', 'unavailable') \
                 THEN {r}expires_at + interval '{tombstone_ms} milliseconds' \
                 ELSE {r}expires_at END)"
            )
        };
        let (until_row, until_r) = (until(""), until("r."));
        // The claim function's `until_row`: the window is its argument.
        let until_fn = "(CASE WHEN t.state IN ('completed', 'unavailable') \
             THEN t.expires_at + p_tombstone_ms * interval '1 millisecond' \
             ELSE t.expires_at END)";
        let held_recheck_ms = crate::store::waiters::RECHECK_FIRST.as_millis();
        // The key's advisory lock (seeded per table, scope and key hashed as
        // separate fields). Every claim takes it; a transactional claim holds
        // it until its transaction ends, which is its proof of life: a claim
        // never waits for it, it answers "in progress". A collision of two
        // keys' hashes only makes one wait for the other.
        let lock_seed =
            i64::from_str_radix(&super::hex_sha256(t.as_bytes())[..15], 16).expect("hex digits");
        let key_hash = match colliding_key_locks {
            // Tests only: every key of a scope shares one lock, a collision
            // (`$2` kept, typed, and ignored).
            true => format!("hashtextextended($1 || left($2, 0), {lock_seed})"),
            false => format!("hashtextextended($2, hashtextextended($1, {lock_seed}))"),
        };
        let try_lock = format!("pg_try_advisory_xact_lock({key_hash})");
        // A key's waiters' lock (seeded apart from the keys'): held shared by
        // the listener's session for each of its instance's waiters, tried
        // exclusive by a transactional completion, which notifies only when
        // it is held (see `register_waiter`). A collision only makes a
        // completion notify for nobody, or a waiter register again.
        let waiter_seed = i64::from_str_radix(
            &super::hex_sha256(format!("{t} waiters").as_bytes())[..15],
            16,
        )
        .expect("hex digits");
        let waiter_hash = match colliding_key_locks {
            true => format!("hashtextextended($1 || left($2, 0), {waiter_seed})"),
            false => format!("hashtextextended($2, hashtextextended($1, {waiter_seed}))"),
        };
        // The scope's lock (seeded apart from the keys'). A transactional
        // claim holds it shared until its transaction ends, since its row is
        // invisible to anyone else until then; `purge_scope` takes it
        // exclusive, so it waits for the scope's running transactions and
        // their records are there to delete, and a transactional claim made
        // meanwhile answers "in progress" (it never waits for it). Plain
        // claims are committed rows a purge sees; they never take it.
        let scope_seed = i64::from_str_radix(
            &super::hex_sha256(format!("{t} scope").as_bytes())[..15],
            16,
        )
        .expect("hex digits");
        let scope_lock = format!("hashtextextended($1, {scope_seed})");
        let try_scope = format!("pg_try_advisory_xact_lock_shared({scope_lock})");

        // Numbered migrations (see `migrate`); the first one adopts a table
        // created before versions were recorded.
        let migrations = vec![
            format!(
                r#"CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint;
CREATE TABLE IF NOT EXISTS {t} (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    token       bigint      NOT NULL,
    state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    status      smallint,
    headers     bytea,
    body        bytea,
    PRIMARY KEY (scope, key),
    CHECK ((state = 'completed') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS "{index}" ON {t} (expires_at);"#
            ),
            // 2: a completed request whose response is not replayable (its body
            // failed, or was over the record limit): state 'unavailable', no
            // response. The checks of version 1 are replaced by named ones.
            format!(
                r#"DO $$ DECLARE c record; BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = '{t}'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE {t} DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE {t} ADD CONSTRAINT "{state_check}"
    CHECK (state IN ('in_progress', 'completed', 'unavailable'));
ALTER TABLE {t} ADD CONSTRAINT "{response_check}"
    CHECK ((state = 'completed') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL));"#
            ),
            // 3: takeovers. A claim that took over one still in progress
            // past its lock keeps the count of takeovers in a row and the
            // previous claim's token and start, which `begin` returns. Rows
            // already there are first attempts. A constant default adds the
            // columns without rewriting the table.
            format!(
                r#"ALTER TABLE {t}
    ADD COLUMN IF NOT EXISTS attempt             integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS previous_token      bigint,
    ADD COLUMN IF NOT EXISTS previous_created_at timestamptz;"#
            ),
            // 4: tombstones. A completed row past its retention may be reduced
            // to its identity and fingerprint (state 'expired', no response),
            // its `expires_at` moved to its tombstone window's end.
            format!(
                r#"ALTER TABLE {t} DROP CONSTRAINT "{state_check}";
ALTER TABLE {t} ADD CONSTRAINT "{state_check}"
    CHECK (state IN ('in_progress', 'completed', 'unavailable', 'expired'));"#
            ),
            // 5: recovery points. The outputs of a claimed request's finished
            // phases, with the fingerprint of the request that recorded them
            // (another request of the key after a release sees none of them),
            // kept for the lock timeout plus the retention.
            format!(
                r#"CREATE TABLE IF NOT EXISTS {p} (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    phase       text        NOT NULL,
    fingerprint bytea       NOT NULL,
    output      bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key, phase)
);
CREATE INDEX IF NOT EXISTS "{phases_index}" ON {p} (expires_at);"#
            ),
            // 6: transactional mode's claim, one call (see `claim_key`). The
            // key's lock, then its row read on a snapshot taken after it
            // (a VOLATILE function takes one per query), then one row: the
            // live record's answer, or a claim, or "in progress" (the lock is
            // someone else's, or a transaction holds the expired row). A
            // claim draws its token and returns the transaction's id, and
            // whether it is over an expired row (the completion then
            // replaces it, otherwise inserts). An expired row is taken over
            // only if no transaction holds it (the `FOR UPDATE SKIP LOCKED`
            // locks it, so a late completion by the claim it replaces waits
            // for this transaction and then finds its token gone); a row left
            // `in_progress` was a dead claim: the attempt goes on from it.
            // Procedural on purpose: one primary-key read in the common case
            // costs the server about half what one statement of CTEs did
            // (docs/benchmarks.md).
            // The idle timeout is switched off for the transaction (see
            // `OPEN`); a transaction that is not READ COMMITTED reads nothing
            // (its snapshot predates the lock) and says so.
            format!(
                r#"CREATE OR REPLACE FUNCTION "{schema}"."{claim_function}"(
    p_scope text, p_key text, p_fp bytea,
    p_scope_lock bigint, p_key_lock bigint, p_tombstone_ms bigint)
RETURNS TABLE (o_outcome text, o_token bigint, o_status smallint, o_headers bytea,
               o_body bytea, o_remaining bigint, o_attempt integer,
               o_previous_token bigint, o_previous_created_at timestamptz,
               o_xact bigint, o_over boolean, o_read_committed boolean)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    locked boolean;
    found_row boolean;
    r record;
BEGIN
    IF set_config('idle_in_transaction_session_timeout', '0', true) IS NULL
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        o_read_committed := false;
        RETURN NEXT;
        RETURN;
    END IF;
    o_read_committed := true;
    locked := pg_try_advisory_xact_lock_shared(p_scope_lock)
              AND pg_try_advisory_xact_lock(p_key_lock);
    SELECT t.fingerprint = p_fp AS same, t.state, t.status, t.headers, t.body, t.token,
           t.attempt, t.created_at,
           {until_fn} > now() AS live,
           t.state = 'expired' OR t.expires_at <= now() AS tomb,
           ceil(extract(epoch FROM t.expires_at - now()) * 1000)::bigint AS remaining
    INTO r
    FROM {t} AS t WHERE t.scope = p_scope AND t.key = p_key;
    found_row := FOUND;
    IF found_row AND r.live THEN
        o_outcome := CASE WHEN NOT r.same THEN 'mismatch' WHEN r.tomb THEN 'expired'
                          WHEN r.state = 'completed' THEN 'replay'
                          WHEN r.state = 'unavailable' THEN 'unavailable'
                          ELSE 'in_progress' END;
        IF r.same AND NOT r.tomb AND r.state = 'completed' THEN
            o_status := r.status;
            o_headers := r.headers;
            o_body := r.body;
        END IF;
        IF r.same AND NOT r.tomb AND r.state IN ('completed', 'unavailable') THEN
            o_remaining := r.remaining;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    IF locked AND found_row THEN
        PERFORM 1 FROM {t} AS t
        WHERE t.scope = p_scope AND t.key = p_key AND {until_fn} <= now()
        FOR UPDATE SKIP LOCKED;
        locked := FOUND;
    END IF;
    IF NOT locked THEN
        o_outcome := 'in_progress';
        RETURN NEXT;
        RETURN;
    END IF;
    o_outcome := 'claimed';
    o_token := nextval('{seq}');
    o_xact := txid_current();
    o_over := found_row;
    o_attempt := 1;
    IF found_row AND r.state = 'in_progress' THEN
        o_attempt := r.attempt + 1;
        o_previous_token := r.token;
        o_previous_created_at := r.created_at;
    END IF;
    RETURN NEXT;
END
$claim$;"#
            ),
        ];

        // One statement in every case. `live` is the unexpired row in the statement's
        // snapshot; only when there is none does the INSERT produce a row (so a replay,
        // a mismatch or an in-progress answer writes nothing, takes no row lock and
        // draws no token). The upsert takes over a row that expired, judged on the
        // row's latest committed version, and only if no transaction holds that row
        // (`free`, which skips a locked row instead of waiting for it): a handler
        // running in transactional mode holds its row, so it stays in progress past
        // its lock's expiry, and no pooled connection ever waits behind it. A claim also
        // needs the key's advisory lock (`held`: someone else's claim is being made or
        // runs in its transaction). Transactional mode runs this same statement inside
        // the handler's transaction, so its claim row and lock last until that ends and
        // one commit records both. A completed row past its retention is a tombstone
        // until its window's end (`until`): `live` still, answering 'expired' to
        // its fingerprint (in place, whether or not a purge has dropped its
        // response yet). Zero rows come back only when a concurrent
        // transaction committed a live row after this statement's snapshot; the caller
        // then runs the statement again (in a new transaction, in transactional mode).
        let begin_statement = |locked: bool| {
            let (held, xact) = match locked {
                true => (format!("{try_scope} AND {try_lock}"), "txid_current()"),
                false => (try_lock.clone(), "NULL::bigint"),
            };
            format!(
                r#"WITH held AS (
    SELECT NOT ({held}) AS held
), live AS (
    SELECT fingerprint = $3 AS same, state = 'completed' AS done,
           state = 'unavailable' AS unavailable,
           state = 'expired' OR expires_at <= now() AS tomb, status, headers, body,
           ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint AS remaining
    FROM {t}
    WHERE scope = $1 AND key = $2 AND {until_row} > now()
), expired AS (
    SELECT 1 FROM {t} WHERE scope = $1 AND key = $2 AND {until_row} <= now()
), free AS (
    SELECT 1 FROM {t} WHERE scope = $1 AND key = $2 AND {until_row} <= now()
    FOR UPDATE SKIP LOCKED
), claimed AS (
    INSERT INTO {t} AS r (scope, key, fingerprint, token, state, created_at, expires_at)
    SELECT $1, $2, $3, nextval('{seq}'), 'in_progress', now(),
           now() + interval '{lock_ms} milliseconds'
    WHERE NOT EXISTS (SELECT 1 FROM live)
      AND NOT (SELECT held FROM held)
      AND (EXISTS (SELECT 1 FROM free) OR NOT EXISTS (SELECT 1 FROM expired))
    ON CONFLICT (scope, key) DO UPDATE
    SET fingerprint = excluded.fingerprint, token = excluded.token, state = 'in_progress',
        created_at = excluded.created_at, expires_at = excluded.expires_at,
        status = NULL, headers = NULL, body = NULL,
        attempt = CASE WHEN r.state = 'in_progress' THEN r.attempt + 1 ELSE 1 END,
        previous_token = CASE WHEN r.state = 'in_progress' THEN r.token END,
        previous_created_at = CASE WHEN r.state = 'in_progress' THEN r.created_at END
    WHERE {until_r} <= now()
    RETURNING r.token, r.attempt, r.previous_token, r.previous_created_at
)
SELECT 'claimed'::text AS outcome, token, NULL::smallint AS status,
       NULL::bytea AS headers, NULL::bytea AS body, NULL::bigint AS remaining,
       attempt, previous_token, previous_created_at, {xact} AS xact
FROM claimed
UNION ALL
SELECT CASE WHEN NOT same THEN 'mismatch' WHEN tomb THEN 'expired' WHEN done THEN 'replay'
            WHEN unavailable THEN 'unavailable' ELSE 'in_progress' END,
       NULL::bigint,
       CASE WHEN same AND done AND NOT tomb THEN status END,
       CASE WHEN same AND done AND NOT tomb THEN headers END,
       CASE WHEN same AND done AND NOT tomb THEN body END,
       CASE WHEN same AND (done OR unavailable) AND NOT tomb THEN remaining END,
       NULL::integer, NULL::bigint, NULL::timestamptz, NULL::bigint
FROM live
UNION ALL
SELECT 'in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT 1 FROM live)
  AND ((EXISTS (SELECT 1 FROM expired) AND NOT EXISTS (SELECT 1 FROM free))
       OR (SELECT held FROM held))"#
            )
        };
        let begin = begin_statement(false);
        let begin_locked = begin_statement(true);

        // Transactional mode writes the record once, at completion: no one
        // else can see an uncommitted claim, so the claim is the key's
        // advisory lock alone, held by the handler's transaction (rivals on
        // every instance try it and answer "in progress" without waiting; a
        // dead owner's lock goes with its session). The lock and the read run
        // in one call of the table's claim function (migration 6): a VOLATILE
        // function takes a fresh snapshot for each query it runs (READ
        // COMMITTED), so its read, after the lock, sees every record committed
        // under that lock before it was released (a commit becomes visible
        // before its transaction's locks are let go). The lock ids are
        // computed here, so the function carries no seed; nor does it carry
        // the tombstone window (an argument), only the table and sequence.
        let claim_key = format!(
            r#"SELECT * FROM "{schema}"."{claim_function}"($1, $2, $3, {scope_lock}, {key_hash}, {tombstone_ms})"#
        );
        // The record, written once, in the transaction that claimed (`$5`,
        // its id), over nothing: a plain `INSERT` (no speculative insertion,
        // no row read back). It fails unless it runs in that transaction (a
        // division by zero in the token) or if a row is there after all (the
        // primary key), so that the COMMIT pipelined after it rolls back
        // instead: the handler's writes never commit unrecorded. `$6..` are
        // the response, when there is one. It answers whether the key has
        // waiters (their lock is held, shared, by some listener's session):
        // its wake-up is sent only then. Tried exclusive, the waiters' lock
        // is this transaction's until its commit is visible, so a waiter
        // that registers meanwhile fails to, and tries again (see
        // `register_waiter`).
        let insert = |state: &str, response: &str, values: &str| {
            format!(
                r#"INSERT INTO {t} (scope, key, fingerprint, token, state, created_at, expires_at{response})
VALUES ($1::text, $2::text, $3::bytea, $4::bigint / (txid_current() = $5::bigint)::int,
        '{state}', now(), now() + interval '{retention_ms} milliseconds'{values})
RETURNING NOT pg_try_advisory_xact_lock({waiter_hash}) AS waited"#
            )
        };
        let record_locked = insert(
            "completed",
            ", status, headers, body",
            ", $6::smallint, $7::bytea, $8::bytea",
        );
        let record_locked_unavailable = insert("unavailable", "", "");
        // The record over the expired row the claim function locked (its
        // takeover), in the transaction that claimed (`$5`, its id). It
        // fails otherwise (a division by zero), so that the COMMIT pipelined
        // after it rolls back instead: the handler's writes never commit
        // unrecorded. `$6..` are the response, when there is one.
        let record = |state: &str, response: &str, values: &str| {
            format!(
                r#"WITH done AS (
    INSERT INTO {t} AS r (scope, key, fingerprint, token, state, created_at, expires_at{response})
    SELECT $1::text, $2::text, $3::bytea, $4::bigint, '{state}', now(),
           now() + interval '{retention_ms} milliseconds'{values}
    WHERE txid_current() = $5::bigint
    ON CONFLICT (scope, key) DO UPDATE
    SET fingerprint = excluded.fingerprint, token = excluded.token, state = excluded.state,
        created_at = excluded.created_at, expires_at = excluded.expires_at,
        status = excluded.status, headers = excluded.headers, body = excluded.body,
        attempt = 1, previous_token = NULL, previous_created_at = NULL
    WHERE {until_r} <= now()
    RETURNING 1
)
SELECT 1 / (SELECT count(*)::int FROM done)"#
            )
        };
        let replace_locked = record(
            "completed",
            ", status, headers, body",
            ", $6::smallint, $7::bytea, $8::bytea",
        );
        let replace_locked_unavailable = record("unavailable", "", "");

        // A completion, fenced by the claim's token. In the handler's
        // transaction (`locked`) it also fails unless it completed the claim (a
        // division by zero), so that the COMMIT pipelined after it rolls back
        // instead: the handler's writes never commit unrecorded. Its waiters are
        // notified by a statement of its own after the commit (see `notify`).
        // In the handler's transaction it also checks that it runs in the
        // transaction that claimed (`xact`, the parameter after the others): a
        // transaction ended by its handler does not record, whatever ran after.
        // The key's recovery points are done with once it completes: deleted
        // with it (an empty range of the primary key when it used none).
        let completion = |set: &str, xact: Option<u8>| {
            let (select, same_transaction) = match xact {
                Some(n) => (
                    "SELECT 1 / (SELECT count(*)::int FROM done)",
                    format!(" AND txid_current() = ${n}"),
                ),
                None => ("SELECT 1 FROM done", String::new()),
            };
            format!(
                r#"WITH done AS (
    UPDATE {t}
    SET {set}, expires_at = now() + interval '{retention_ms} milliseconds'
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'{same_transaction}
    RETURNING 1
), phases_done AS (
    DELETE FROM {p} WHERE scope = $1 AND key = $2 AND EXISTS (SELECT 1 FROM done)
)
{select}"#
            )
        };
        let response = "state = 'completed', status = $4, headers = $5, body = $6";
        let unavailable = "state = 'unavailable'";
        let complete = completion(response, None);
        let complete_locked = completion(response, Some(7));
        let complete_unavailable = completion(unavailable, None);
        let complete_locked_unavailable = completion(unavailable, Some(4));

        // A live claim's recovery points live on with it (an empty range of
        // the phases' primary key for a claim that recorded none).
        let extend = format!(
            r#"WITH held AS (
    UPDATE {t}
    SET expires_at = now() + interval '{lock_ms} milliseconds'
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
    RETURNING fingerprint
), kept AS (
    UPDATE {p} AS p SET expires_at = now() + interval '{phase_keep_ms} milliseconds'
    FROM held
    WHERE p.scope = $1 AND p.key = $2 AND p.fingerprint = held.fingerprint
      AND p.expires_at > now()
)
SELECT 1 FROM held"#
        );

        let release = format!(
            r#"DELETE FROM {t}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'"#
        );

        // Times as milliseconds on the database's clock. A claim past its
        // lock is still shown; a completed record past its retention is not.
        // A completed row past its retention (or one a purge reduced) is
        // shown as its tombstone, until its window's end.
        let inspect = format!(
            r#"SELECT CASE WHEN state <> 'in_progress' AND expires_at <= now() THEN 'expired'
            ELSE state END AS state,
       token, attempt, status,
       octet_length(body)::bigint AS body_bytes,
       (extract(epoch FROM created_at) * 1000)::bigint AS since_ms,
       (extract(epoch FROM CASE WHEN state <> 'in_progress' AND expires_at <= now()
                           THEN {until_row} ELSE expires_at END) * 1000)::bigint AS expires_ms
FROM {t}
WHERE scope = $1 AND key = $2 AND (state = 'in_progress' OR {until_row} > now())"#
        );

        // A row a transaction holds (a handler running in transactional
        // mode: its owner is alive) is skipped, never waited for, and so not
        // released; so is a claim with more than a tenth of its lock left
        // (`alive`). `present` reads the snapshot before the delete.
        let tenth_lock_ms = lock_ms / 10;
        let release_stuck = format!(
            r#"WITH target AS (
    SELECT scope, key FROM {t}
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
      AND expires_at <= now() + interval '{tenth_lock_ms} milliseconds'
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {t} AS r USING target
    WHERE r.scope = target.scope AND r.key = target.key
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM gone) AS released,
       EXISTS (SELECT 1 FROM {t}
               WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
                 AND expires_at > now() + interval '{tenth_lock_ms} milliseconds') AS alive,
       EXISTS (SELECT 1 FROM {t}
               WHERE scope = $1 AND key = $2
                 AND (state = 'in_progress' OR expires_at > now())) AS present"#
        );

        // A claim past its lock whose row a transaction still holds is in progress
        // too, and so is a key whose advisory lock a transaction holds (its claim
        // is not committed yet); their waiters re-check on their backoff (or are
        // woken by the commit). So is a key whose scope a purge holds (a
        // transactional claim answers "in progress" until it ends). The locks are
        // only tried when no claim row answers.
        let lock_remaining = format!(
            r#"WITH claim AS (
    SELECT expires_at FROM {t} WHERE scope = $1 AND key = $2 AND state = 'in_progress'
), free AS (
    SELECT 1 FROM {t}
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND expires_at <= now()
    FOR UPDATE SKIP LOCKED
)
SELECT CASE WHEN expires_at > now()
            THEN ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint
            ELSE {held_recheck_ms} END
FROM claim
WHERE expires_at > now() OR NOT EXISTS (SELECT 1 FROM free)
UNION ALL
SELECT {held_recheck_ms} WHERE NOT {try_lock}
UNION ALL
SELECT {held_recheck_ms} WHERE NOT {try_scope}
LIMIT 1"#
        );

        let lock_claim = format!(
            r#"SELECT txid_current() FROM {t}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
FOR UPDATE"#
        );

        // Each purge batch also deletes as many expired phases, counted apart
        // (they are not records): the purge goes on while either fills it.
        let expired_phases = |limit: &str| {
            format!(
                r#"phases_gone AS (
    DELETE FROM {p} WHERE (scope, key, phase) IN (
        SELECT scope, key, phase FROM {p}
        WHERE expires_at <= now()
        ORDER BY expires_at
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)"#
            )
        };
        // One batch of the oldest rows past their `expires_at`: a completed
        // row within its tombstone window is reduced to its tombstone (its
        // response dropped, its `expires_at` moved to the window's end, so the
        // next batch does not see it again), every other row is deleted
        // (tombstones whose window ended among them). The `(expires_at)` index
        // yields the oldest first, so a batch reads about as many index entries
        // as it changes rows; it answers how many it changed, then how many
        // phases it deleted.
        let purge_statement = |limit: &str| {
            let entombed = format!(
                "doomed.state IN ('completed', 'unavailable') \
                 AND doomed.expires_at + interval '{tombstone_ms} milliseconds' > now()"
            );
            let phases_gone = expired_phases(limit);
            format!(
                r#"WITH doomed AS (
    SELECT scope, key, state, expires_at FROM {t}
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), {phases_gone}, deleted AS (
    DELETE FROM {t} AS r USING doomed
    WHERE r.scope = doomed.scope AND r.key = doomed.key AND NOT ({entombed})
    RETURNING 1
), entombed AS (
    UPDATE {t} AS r
    SET state = 'expired', status = NULL, headers = NULL, body = NULL,
        expires_at = doomed.expires_at + interval '{tombstone_ms} milliseconds'
    FROM doomed
    WHERE r.scope = doomed.scope AND r.key = doomed.key AND {entombed}
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted) + (SELECT count(*) FROM entombed),
       (SELECT count(*) FROM phases_gone)"#
            )
        };
        let purge = purge_statement(&PURGE_BATCH.to_string());
        // The same batch with its size a parameter (a bigint), for `PurgeTask`.
        let purge_batch = purge_statement("$1");

        let purge_scope = format!(
            r#"WITH doomed AS (
    SELECT scope, key FROM {t}
    WHERE scope = $1
    LIMIT {PURGE_BATCH}
    FOR UPDATE
)
DELETE FROM {t} AS r USING doomed
WHERE r.scope = doomed.scope AND r.key = doomed.key"#
        );

        let lock_scope = format!("SELECT pg_advisory_xact_lock({scope_lock})");

        let listen = format!(r#"LISTEN "{channel}""#);

        let phases = format!(
            r#"SELECT NULL::text AS phase, NULL::bytea AS output FROM {t}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
UNION ALL
SELECT p.phase, p.output FROM {p} AS p JOIN {t} AS r
    ON r.scope = p.scope AND r.key = p.key AND r.fingerprint = p.fingerprint
WHERE r.scope = $1 AND r.key = $2 AND r.token = $3 AND r.state = 'in_progress'
    AND p.expires_at > now()"#
        );
        // Refused while another request of the key (an earlier one,
        // released) has unexpired phases: they are kept for its retry. An
        // expired row of the phase is replaced; the request's own first
        // record of it stands, and the record renews the request's others.
        let phase_expiry = format!("now() + interval '{phase_keep_ms} milliseconds'");
        let record_phase = format!(
            r#"WITH owner AS (
    SELECT fingerprint FROM {t}
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
    FOR SHARE
), other AS (
    SELECT 1 FROM {p} AS p, owner
    WHERE p.scope = $1 AND p.key = $2 AND p.fingerprint <> owner.fingerprint
      AND p.expires_at > now()
    LIMIT 1
), recorded AS (
    INSERT INTO {p} AS p (scope, key, phase, fingerprint, output, expires_at)
    SELECT $1, $2, $4, fingerprint, $5, {phase_expiry} FROM owner
    WHERE NOT EXISTS (SELECT 1 FROM other)
    ON CONFLICT (scope, key, phase) DO UPDATE
    SET fingerprint = excluded.fingerprint, output = excluded.output,
        created_at = now(), expires_at = excluded.expires_at
    WHERE p.fingerprint <> excluded.fingerprint OR p.expires_at <= now()
    RETURNING 1
), renewed AS (
    UPDATE {p} AS p SET expires_at = {phase_expiry}
    FROM owner
    WHERE p.scope = $1 AND p.key = $2 AND p.phase <> $4
      AND p.fingerprint = owner.fingerprint AND p.expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM other)
)
SELECT EXISTS (SELECT 1 FROM owner) AS owned,
       EXISTS (SELECT 1 FROM recorded) AS recorded,
       (SELECT output FROM {p}
        WHERE scope = $1 AND key = $2 AND phase = $4 AND expires_at > now()
          AND fingerprint = (SELECT fingerprint FROM owner)) AS earlier,
       EXISTS (SELECT 1 FROM other) AS held"#
        );
        let purge_scope_phases = format!("DELETE FROM {p} WHERE scope = $1");

        Self {
            migrations,
            begin,
            begin_locked,
            claim_key,
            register_waiter: format!("SELECT pg_try_advisory_lock_shared({waiter_hash})"),
            unregister_waiter: format!("SELECT pg_advisory_unlock_shared({waiter_hash})"),
            record_locked,
            record_locked_unavailable,
            replace_locked,
            replace_locked_unavailable,
            complete,
            extend,
            complete_unavailable,
            complete_locked_unavailable,
            release,
            inspect,
            release_stuck,
            lock_remaining,
            lock_claim,
            complete_locked,
            purge,
            purge_batch,
            purge_scope,
            lock_scope,
            listen,
            channel: channel.to_owned(),
            notify_purge: format!("SELECT pg_notify('{channel}', '{PURGED}')"),
            notify: format!("SELECT pg_notify('{channel}', $1)"),
            phases,
            record_phase,
            purge_scope_phases,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain_lower_case_names_of_at_most_63_bytes() {
        for ok in ["a", "_", "idempotency_records", "t1", &"a".repeat(63)] {
            assert!(is_identifier(ok), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in [
            "", "1t", "T", "a-b", "a b", "a\"b", "a;drop", "é", "a.b", &long,
        ] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn no_statement_that_writes_also_notifies() {
        // A NOTIFY in a writing transaction holds PostgreSQL's global notify
        // lock through that transaction's WAL flush: commits go one at a time.
        let sql = Sql::new(
            "public",
            "records",
            "chan",
            Duration::from_secs(10),
            Duration::from_secs(60),
            false,
            Duration::from_secs(600),
        );
        let writers = [
            &sql.begin,
            &sql.begin_locked,
            &sql.claim_key,
            &sql.record_locked,
            &sql.record_locked_unavailable,
            &sql.replace_locked,
            &sql.replace_locked_unavailable,
            &sql.migrations[5],
            &sql.complete,
            &sql.complete_locked,
            &sql.complete_unavailable,
            &sql.complete_locked_unavailable,
            &sql.extend,
            &sql.release,
            &sql.release_stuck,
            &sql.purge,
            &sql.purge_batch,
            &sql.purge_scope,
            &sql.record_phase,
            &sql.purge_scope_phases,
        ];
        for statement in writers {
            assert!(!statement.contains("pg_notify"), "{statement}");
        }
        assert!(sql.notify.contains("pg_notify") && !sql.notify.contains("UPDATE"));
    }

    #[test]
    fn derived_names_fit_and_stay_distinct() {
        assert_eq!(derived_name("records", "token_seq"), "records_token_seq");
        let a = format!("{}a", "x".repeat(62));
        let b = format!("{}b", "x".repeat(62));
        let (da, db) = (
            derived_name(&a, "expires_at_idx"),
            derived_name(&b, "expires_at_idx"),
        );
        assert!(da.len() <= 63 && db.len() <= 63);
        assert_ne!(da, db);
        assert!(is_identifier(&da));
    }
}
