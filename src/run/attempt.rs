//! Which attempt a claimed run is: the first, or a takeover of a claim whose
//! owner died or stalled past its lock.

use crate::store::{Claim, FencingToken};
use std::time::SystemTime;

/// Which attempt at its key a claimed run is.
///
/// A claim whose owner died (or stalled past its lock) without completing
/// it is taken over by the next request with its key, under a higher
/// fencing token. The handler that runs then may find the effects of the
/// earlier run half done: a charge made but not recorded. With
/// [`is_takeover`](Self::is_takeover) it knows to reconcile first (look
/// the charge up by its downstream key) instead of acting blind.
///
/// [`IdempotencyLayer`](crate::IdempotencyLayer) puts it in the request's
/// extensions of every run it claims (plain and transactional);
/// [`Engine`](crate::engine::Engine) operations find it in
/// [`RunContext::attempt`](crate::engine::RunContext::attempt).
///
/// The count restarts at 1 whenever the key is free: a claim that was
/// released (a handler error, a response the policy does not record) is not
/// taken over, as its owner ran to an answer the application chose not to
/// keep. A store may also forget a claim once its lock has run out
/// (`purge_expired`, a full `MemoryStore`'s sweep, Redis after the lock plus
/// the retention), and with it that an earlier run began: a takeover means
/// an earlier run certainly began; a first attempt does not prove that none
/// did. In transactional mode on `PostgresStore` the claim lives in the
/// handler's transaction, so a crash rolls both back and the retry is a
/// first attempt over a clean database (effects outside it still need a
/// downstream key).
///
/// ```
/// use axum::{http::StatusCode, routing::post, Extension, Router};
/// use tower_idempotency::{IdempotencyLayer, MemoryStore, downstream::DownstreamKeys, engine::Attempt};
///
/// # struct Payments;
/// # impl Payments {
/// #     async fn find(&self, _key: &str) -> Option<String> { None }
/// #     async fn charge(&self, _key: &str, _cents: u64) -> String { "ch_1".into() }
/// # }
/// # static PAYMENTS: Payments = Payments;
/// async fn charge(
///     Extension(attempt): Extension<Attempt>,
///     Extension(keys): Extension<DownstreamKeys>,
/// ) -> (StatusCode, String) {
///     let charge_key = keys.key_for("card-processor");
///     // An earlier run may have charged before it died: look before charging again.
///     if attempt.is_takeover() {
///         if let Some(charge) = PAYMENTS.find(charge_key.as_str()).await {
///             return (StatusCode::CREATED, charge);
///         }
///     }
///     (StatusCode::CREATED, PAYMENTS.charge(charge_key.as_str(), 1000).await)
/// }
///
/// let app: Router = Router::new()
///     .route("/charges", post(charge))
///     .layer(IdempotencyLayer::new(MemoryStore::new()));
/// # let _ = app;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    claim: Claim,
}

impl Attempt {
    /// 1 for the first claim of a free key, 2 after one takeover, and so on.
    pub fn number(&self) -> u32 {
        self.claim.attempt()
    }

    /// Whether this run took over a claim that never completed.
    pub fn is_takeover(&self) -> bool {
        self.claim.takeover.is_some()
    }

    /// This run's fencing token.
    pub fn token(&self) -> FencingToken {
        self.claim.token
    }

    /// The fencing token of the owner this run took over from.
    pub fn previous_token(&self) -> Option<FencingToken> {
        self.claim.takeover.map(|t| t.previous_token)
    }

    /// When the claim this run took over was made, on the store's clock.
    pub fn previous_began(&self) -> Option<SystemTime> {
        self.claim.takeover.map(|t| t.previous_began)
    }
}

/// The attempt of a claim, as the store made it (also for handler tests).
impl From<Claim> for Attempt {
    fn from(claim: Claim) -> Self {
        Self { claim }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_attempt_reads_its_claim() {
        let first = Attempt::from(Claim::first(FencingToken::new(3)));
        assert_eq!(
            (first.number(), first.is_takeover(), first.token()),
            (1, false, FencingToken::new(3))
        );
        assert_eq!(
            (first.previous_token(), first.previous_began()),
            (None, None)
        );

        let began = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let third = Attempt::from(Claim::takeover(
            FencingToken::new(9),
            3,
            FencingToken::new(5),
            began,
        ));
        assert_eq!((third.number(), third.is_takeover()), (3, true));
        assert_eq!(third.previous_token(), Some(FencingToken::new(5)));
        assert_eq!(third.previous_began(), Some(began));
    }
}
