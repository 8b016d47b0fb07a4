//! `RedisStore`'s recovery points: a hash per key beside its record, in its
//! slot, written by scripts that check the claim's token.
//!
//! A phase's own writes (to the application's database) are not part of
//! that script: run-then-record, so a crash between the two runs the phase
//! again on the retry. Make such a phase idempotent of itself, or a foreign
//! phase with its downstream key.

use super::{backend, millis, phase_names, RedisStore, OPERATION};
use crate::store::phases::{check_phase, phases_of_another_request};
use crate::store::{FencingToken, PhaseRecord, PhaseStore, RecordKey, RecordedPhases, StoreError};
use bytes::Bytes;
use redis::Value;

fn corrupt(what: &str) -> StoreError {
    backend(format!("unexpected phase reply: {what}"))
}

fn owned(reply: &[Value]) -> Result<i64, StoreError> {
    let first = reply.first().ok_or_else(|| corrupt("empty"))?;
    redis::from_redis_value(first.clone()).map_err(backend)
}

impl PhaseStore for RedisStore {
    async fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<RecordedPhases, StoreError> {
        let inner = &self.inner;
        let phases = phase_names(&inner.config.prefix, key);
        let mut invocation = inner.scripts.phases.key(&phases.record);
        invocation
            .key(&phases.phases)
            .key(&phases.index)
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(token.0.to_string());
        let reply: Vec<Value> = inner
            .settings
            .timed(OPERATION, inner.invoke(&invocation))
            .await?;
        if owned(&reply)? != 1 {
            return Err(StoreError::ClaimLost);
        }
        let mut recorded = RecordedPhases::new();
        for pair in reply[1..].chunks(2) {
            let [name, output] = pair else {
                return Err(corrupt("a phase without its output"));
            };
            let name: String = redis::from_redis_value(name.clone()).map_err(backend)?;
            let output: Vec<u8> = redis::from_redis_value(output.clone()).map_err(backend)?;
            recorded.insert(&name, Bytes::from(output));
        }
        Ok(recorded)
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
        let phases = phase_names(&inner.config.prefix, key);
        let mut invocation = inner.scripts.record_phase.key(&phases.record);
        invocation
            .key(&phases.phases)
            .key(&phases.index)
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(token.0.to_string())
            .arg(phase)
            .arg(&output[..])
            .arg(millis(inner.phases_kept()));
        inner
            .settings
            .timed(OPERATION, async {
                let reply: Vec<Value> = inner.invoke(&invocation).await?;
                match owned(&reply)? {
                    1 => {
                        // As a completion is: on the replicas before it counts.
                        inner
                            .replicated(inner.tag(key).phases(key.key().as_str()))
                            .await?;
                        Ok(PhaseRecord::Recorded)
                    }
                    2 => {
                        let earlier = reply.get(1).ok_or_else(|| corrupt("no earlier output"))?;
                        let earlier: Vec<u8> =
                            redis::from_redis_value(earlier.clone()).map_err(backend)?;
                        Ok(PhaseRecord::AlreadyRecorded(Bytes::from(earlier)))
                    }
                    3 => Err(phases_of_another_request()),
                    _ => Err(StoreError::ClaimLost),
                }
            })
            .await
    }
}
