//! Charges through the card processor (`examples/processor.rs`) over HTTP,
//! with the request's downstream key as the processor's `Idempotency-Key`:
//! a run of the handler after a crash sends the same key, and the processor
//! answers with the charge it made the first time instead of a second one.
//! (The queue consumer, `examples/consumer.rs`, charges through it too.)

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::time::Duration;
use tower_idempotency::downstream::DownstreamKey;

/// The name of the processor's call among the handler's downstream keys.
pub const CARD_PROCESSOR: &str = "card-processor";

/// The processor at a base URL (`http://127.0.0.1:3001`).
#[derive(Clone)]
pub struct Processor {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A charge the processor answered with.
pub struct Charged {
    pub id: String,
    /// Made before, under the same key: nothing was charged now.
    pub replayed: bool,
}

/// Why a charge failed: the handler answers `502`, records nothing, and a
/// retry charges again under the same key (so at most once in all).
#[derive(Debug)]
pub struct PaymentError(#[allow(dead_code)] pub String);

impl Processor {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The processor's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Charges `amount` cents under `key`; returns the charge's id, the same
    /// one for every call with this key and these parameters.
    pub async fn charge(
        &self,
        key: &DownstreamKey,
        merchant: &str,
        amount: u64,
        description: &str,
    ) -> Result<String, PaymentError> {
        self.charge_once(key, merchant, amount, description)
            .await
            .map(|charged| charged.id)
    }

    /// [`charge`](Self::charge), saying whether the processor made the
    /// charge now or answered with the one it made before under `key`.
    pub async fn charge_once(
        &self,
        key: &DownstreamKey,
        merchant: &str,
        amount: u64,
        description: &str,
    ) -> Result<Charged, PaymentError> {
        let body = json!({
            "amount": amount, "currency": "USD",
            "merchant": merchant, "description": description,
        });
        let request = http::Request::post(format!("{}/v1/charges", self.base))
            .header("content-type", "application/json")
            .header("idempotency-key", key.to_header_value())
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let (reply, replayed) = self.send(request).await?;
        let id = reply["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| PaymentError(format!("no charge id in {reply}")))?;
        Ok(Charged { id, replayed })
    }

    /// The merchant's charges, as the processor lists them.
    pub async fn charges(&self, merchant: &str) -> Result<Vec<Value>, PaymentError> {
        let uri = format!("{}/v1/charges?merchant={merchant}", self.base);
        let request = http::Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| PaymentError(e.to_string()))?;
        let (reply, _) = self.send(request).await?;
        Ok(reply["charges"].as_array().cloned().unwrap_or_default())
    }

    /// Sends, bounded in time, so the handler always ends with an answer;
    /// returns the body and whether the processor says it is a replay.
    async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<(Value, bool), PaymentError> {
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| PaymentError(e.to_string()))?;
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| PaymentError(e.to_string()))?
                .to_bytes();
            let value: Value =
                serde_json::from_slice(&body).map_err(|e| PaymentError(e.to_string()))?;
            match status.is_success() {
                true => Ok((value, replayed)),
                false => Err(PaymentError(format!("{status}: {value}"))),
            }
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map_err(|_| PaymentError("the processor did not answer in 10 s".into()))?
    }
}
