//! A card processor for the checkout demo to charge, with idempotency keys
//! of its own, as Stripe's API has them: the service at the end of the
//! chain that `DownstreamKeys` are for.
//!
//! ```sh
//! cargo run --example processor                      # on http://127.0.0.1:3001
//! PROCESSOR_URL=http://127.0.0.1:3001 cargo run --example checkout
//! curl -s localhost:3001/v1/charges                  # what it charged
//! ```
//!
//! `POST /v1/charges` with `{"amount": cents, "currency": "USD", "merchant":
//! string, "description": string}` creates a charge (`201`). With an
//! `Idempotency-Key` header (1 to 255 visible ASCII characters) the
//! processor keeps the key with the charge's parameters: the same key with
//! the same parameters is answered with the stored charge and
//! `Idempotent-Replayed: true`, the same key with other parameters is
//! `422 idempotency_key_reuse` and charges nothing. Without the header every
//! request is a new charge, as with Stripe.
//!
//! `GET /v1/charges` lists every charge, oldest first; `?merchant=M` and
//! `?idempotency_key=K` filter them (the second is the look-up a
//! reconciliation makes before charging again).
//!
//! Env: `BIND` (default `127.0.0.1:3001`); `PROCESSOR_LEDGER`, a file the
//! charges are appended to (one JSON object a line, synced before the answer)
//! and read back at startup, so that a restarted processor still knows its
//! keys (default: in memory only).

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

/// One charge, as listed and as stored in the ledger file.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    currency: String,
    merchant: String,
    description: String,
    /// The key it was created under, if any.
    idempotency_key: Option<String>,
    /// The request's parameters, compared with a later request's under the
    /// same key (JSON values: key order and spacing do not matter).
    params: Value,
}

impl Charge {
    fn public(&self) -> Value {
        json!({
            "id": self.id, "amount": self.amount, "currency": self.currency,
            "merchant": self.merchant, "description": self.description,
            "idempotency_key": self.idempotency_key,
        })
    }
}

#[derive(Default)]
struct Ledger {
    charges: Vec<Charge>,
    /// Index into `charges` by idempotency key.
    by_key: HashMap<String, usize>,
    file: Option<std::fs::File>,
}

impl Ledger {
    fn open(path: Option<&str>) -> std::io::Result<Self> {
        let mut ledger = Self::default();
        let Some(path) = path else { return Ok(ledger) };
        if let Ok(existing) = std::fs::File::open(path) {
            for line in std::io::BufReader::new(existing).lines() {
                let charge: Charge = serde_json::from_str(&line?)?;
                ledger.insert(charge);
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        ledger.file = Some(file);
        Ok(ledger)
    }

    fn insert(&mut self, charge: Charge) {
        if let Some(key) = &charge.idempotency_key {
            self.by_key.insert(key.clone(), self.charges.len());
        }
        self.charges.push(charge);
    }

    /// Kept (and on disk) before it is answered, as a processor records a
    /// charge with its key in one write.
    fn append(&mut self, charge: Charge) -> std::io::Result<()> {
        if let Some(file) = &mut self.file {
            let mut line = serde_json::to_vec(&charge)?;
            line.push(b'\n');
            file.write_all(&line)?;
            file.sync_data()?;
        }
        self.insert(charge);
        Ok(())
    }
}

type Shared = Arc<Mutex<Ledger>>;

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "code": code, "message": message }))).into_response()
}

fn valid_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

async fn create_charge(State(ledger): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(key)) if valid_key(key) => Some(key.to_owned()),
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_idempotency_key",
                "1 to 255 visible ASCII characters",
            )
        }
    };
    let Ok(params) = serde_json::from_str::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_body", "a JSON object");
    };
    let (Some(amount), Some(currency), Some(merchant)) = (
        params["amount"].as_u64().filter(|a| *a > 0),
        params["currency"].as_str(),
        params["merchant"].as_str(),
    ) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "send {amount: cents > 0, currency, merchant, description}",
        );
    };
    let description = params["description"].as_str().unwrap_or_default();
    let mut ledger = ledger.lock().unwrap();
    if let Some(&i) = key.as_ref().and_then(|key| ledger.by_key.get(key)) {
        let stored = &ledger.charges[i];
        if stored.params != params {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reuse",
                "this key was used with other parameters; nothing was charged",
            );
        }
        let mut response = (StatusCode::CREATED, Json(stored.public())).into_response();
        response
            .headers_mut()
            .insert("idempotent-replayed", "true".parse().unwrap());
        return response;
    }
    let charge = Charge {
        id: format!("ch_{:06}", ledger.charges.len() + 1),
        amount,
        currency: currency.to_owned(),
        merchant: merchant.to_owned(),
        description: description.to_owned(),
        idempotency_key: key,
        params: params.clone(),
    };
    let (public, id) = (charge.public(), charge.id.clone());
    if ledger.append(charge).is_err() {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ledger_unavailable",
            "nothing was charged",
        );
    }
    println!("charged {id} for {merchant}");
    (StatusCode::CREATED, Json(public)).into_response()
}

#[derive(serde::Deserialize)]
struct Filter {
    merchant: Option<String>,
    idempotency_key: Option<String>,
}

async fn list_charges(State(ledger): State<Shared>, Query(filter): Query<Filter>) -> Json<Value> {
    let ledger = ledger.lock().unwrap();
    let charges: Vec<Value> = ledger
        .charges
        .iter()
        .filter(|c| filter.merchant.as_ref().is_none_or(|m| &c.merchant == m))
        .filter(|c| {
            filter
                .idempotency_key
                .as_ref()
                .is_none_or(|k| c.idempotency_key.as_ref() == Some(k))
        })
        .map(Charge::public)
        .collect();
    Json(json!({ "charges": charges }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3001".into());
    let path = std::env::var("PROCESSOR_LEDGER").ok();
    let ledger = Ledger::open(path.as_deref())?;
    println!("processor ledger: {}", path.as_deref().unwrap_or("memory"));
    println!("charges on record: {}", ledger.charges.len());
    let app = Router::new()
        .route("/v1/charges", post(create_charge).get(list_charges))
        .with_state(Arc::new(Mutex::new(ledger)));
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
