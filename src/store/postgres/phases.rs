//! `PostgresStore`'s recovery points, in `<table>_phases`, and its local
//! phases: the handler's writes and the phase's record in one transaction.

use super::transaction::{rollback, Guarded, Held, PostgresTransaction, OPEN};
use super::{backend, Inner, PostgresStore, TransactionClient, OPERATION};
use crate::store::phases::{check_name, check_phase, phases_of_another_request};
use crate::store::{FencingToken, PhaseRecord, PhaseStore, RecordKey, RecordedPhases, StoreError};
use bytes::Bytes;
use deadpool_postgres::Object;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Mutex;

/// What the phase's record statement answered.
enum Recorded {
    Lost,
    /// Refused: another request's unexpired phases are under the key.
    Held,
    Written,
    Earlier(Bytes),
}

impl Inner {
    async fn record_phase_on(
        &self,
        client: &Object,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: &[u8],
    ) -> Result<Recorded, StoreError> {
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let rows = self
            .query(
                client,
                &self.sql.record_phase,
                &[&scope, &k, &token.0, &phase, &output],
            )
            .await?;
        let row = rows.first().ok_or_else(|| backend("no answer"))?;
        let owned: bool = row.try_get(0).map_err(backend)?;
        let written: bool = row.try_get(1).map_err(backend)?;
        let earlier: Option<Vec<u8>> = row.try_get(2).map_err(backend)?;
        let held: bool = row.try_get(3).map_err(backend)?;
        if owned && held {
            return Ok(Recorded::Held);
        }
        Ok(match (owned, written, earlier) {
            (false, _, _) => Recorded::Lost,
            (true, true, _) => Recorded::Written,
            (true, false, Some(earlier)) => Recorded::Earlier(Bytes::from(earlier)),
            // Written by a concurrent statement of the same claim, committed
            // after this one's snapshot: the next read finds it.
            (true, false, None) => {
                return Err(backend(
                    "the phase was recorded concurrently by the same claim",
                ))
            }
        })
    }
}

impl PhaseStore for PostgresStore {
    async fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<RecordedPhases, StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let rows = inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                inner
                    .query(&client, &inner.sql.phases, &[&scope, &k, &token.0])
                    .await
            })
            .await?;
        if rows.is_empty() {
            return Err(StoreError::ClaimLost);
        }
        let mut phases = RecordedPhases::new();
        for row in &rows {
            let phase: Option<String> = row.try_get(0).map_err(backend)?;
            let output: Option<Vec<u8>> = row.try_get(1).map_err(backend)?;
            if let (Some(phase), Some(output)) = (phase, output) {
                phases.insert(&phase, Bytes::from(output));
            }
        }
        Ok(phases)
    }

    async fn record_phase(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: Bytes,
    ) -> Result<PhaseRecord, StoreError> {
        check_phase(phase, &output)?;
        let inner = &self.inner;
        let recorded = inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                inner
                    .record_phase_on(&client, key, token, phase, &output)
                    .await
            })
            .await?;
        match recorded {
            Recorded::Lost => Err(StoreError::ClaimLost),
            Recorded::Held => Err(phases_of_another_request()),
            Recorded::Written => Ok(PhaseRecord::Recorded),
            Recorded::Earlier(earlier) => Ok(PhaseRecord::AlreadyRecorded(earlier)),
        }
    }
}

impl PostgresStore {
    /// Runs `run` in a transaction of its own and records its output as
    /// `phase` of the claim `token` holds in the same transaction: both
    /// commit, or neither. A token that lost the claim rolls the writes back
    /// ([`StoreError::ClaimLost`]); so does a phase the request recorded
    /// already (its first output is returned); `run`'s error rolls them back
    /// and is returned as it is, in the inner `Err`.
    pub(crate) async fn local_phase<F, Fut, E>(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        run: F,
    ) -> Result<Result<(PhaseRecord, Bytes), E>, StoreError>
    where
        F: FnOnce(TransactionClient) -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
    {
        check_name(phase)?;
        let inner = &self.inner;
        let connection = Guarded::new(inner.settings.timed(OPERATION, inner.client()).await?);
        inner
            .settings
            .timed(OPERATION, async {
                inner.count_round_trips(1);
                connection
                    .client()
                    .batch_execute(OPEN)
                    .await
                    .map_err(backend)
            })
            .await?;
        let handle = PostgresTransaction {
            connection: Arc::new(Mutex::new(Held(Some(connection)))),
        };
        let client = handle.client().await?;
        // The phase's own work: as long as it takes.
        let ran = run(client).await;
        // Once the phase let go of its client (a clone kept past it waits).
        let taken = inner
            .settings
            .timed(OPERATION, async {
                Ok(handle.connection.lock().await.0.take())
            })
            .await?;
        let connection = taken.ok_or_else(|| backend("the phase's transaction has ended"))?;
        let output = match ran {
            Ok(output) => output,
            Err(error) => {
                rollback(inner, connection, None).await;
                return Ok(Err(error));
            }
        };
        if let Err(error) = check_phase(phase, &output) {
            rollback(inner, connection, None).await;
            return Err(error);
        }
        let recorded = inner
            .settings
            .timed(
                OPERATION,
                inner.record_phase_on(connection.client(), key, token, phase, &output),
            )
            .await?;
        match recorded {
            Recorded::Written => {}
            Recorded::Lost => {
                rollback(inner, connection, None).await;
                return Err(StoreError::ClaimLost);
            }
            Recorded::Held => {
                rollback(inner, connection, None).await;
                return Err(phases_of_another_request());
            }
            // Done before: this run's writes are a duplicate of its.
            Recorded::Earlier(earlier) => {
                rollback(inner, connection, None).await;
                return Ok(Ok((PhaseRecord::AlreadyRecorded(earlier.clone()), earlier)));
            }
        }
        // Unknown on an error: the writes and the record committed together
        // or not at all, and the next read of the phases says which.
        inner
            .settings
            .timed(OPERATION, async {
                inner.count_round_trips(1);
                connection
                    .client()
                    .batch_execute("COMMIT")
                    .await
                    .map_err(backend)
            })
            .await?;
        connection.ended();
        Ok(Ok((PhaseRecord::Recorded, output)))
    }
}
