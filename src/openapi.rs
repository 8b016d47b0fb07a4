//! The layer's contract in a [`utoipa`] OpenAPI document (feature `utoipa`).
//!
//! [`IdempotencyDoc`] adds to each guarded operation of the paths it is
//! given (the layer's methods, POST and PATCH by default):
//!
//! - the required `Idempotency-Key` header parameter, with its format (8 to
//!   128 characters of `[A-Za-z0-9._-]`, bare or as an RFC 8941 sf-string);
//! - on its `2xx` responses, the `Idempotent-Replayed`,
//!   `Idempotency-Key-Retention` and `Idempotency-Status` headers;
//! - one response per refusal status (`400`, `401`, `408`, `409`, `410`,
//!   `413`, `429`, `500`, `503`), each refusal's body a schema of its own in
//!   `components/schemas` (`IdempotencyRefusal.<code>`), generated from
//!   [`Refusal`] so that the document lists every answer the layer gives.
//!
//! It documents the default refusal bodies, in the layer's
//! [`ErrorFormat`]; answers built by
//! [`with_refusal_response`](crate::IdempotencyLayer::with_refusal_response)
//! are the application's to document. A response the operation already
//! documents under a refusal's status is left as it is.
//!
//! ```
//! use tower_idempotency::openapi::IdempotencyDoc;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//! use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathsBuilder};
//! use utoipa::openapi::{OpenApiBuilder, Response};
//! use utoipa::Modify;
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new());
//! let create = OperationBuilder::new().response("201", Response::new("the order"));
//! let mut api = OpenApiBuilder::new()
//!     .paths(PathsBuilder::new().path("/v1/orders", PathItem::new(HttpMethod::Post, create)))
//!     .build();
//!
//! // Or `#[openapi(modifiers(&...))]` on a `#[derive(OpenApi)]`.
//! IdempotencyDoc::for_paths(["/v1/orders"]).with_layer(&layer).modify(&mut api);
//!
//! let json = serde_json::to_value(&api).unwrap();
//! let post = &json["paths"]["/v1/orders"]["post"];
//! assert_eq!(post["parameters"][0]["name"], "Idempotency-Key");
//! assert_eq!(post["parameters"][0]["required"], true);
//! assert!(post["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
//! assert!(post["responses"]["201"]["headers"]["Idempotency-Status"].is_object());
//! assert_eq!(
//!     post["responses"]["409"]["content"]["application/json"]["examples"]
//!         ["idempotency_key_reuse"]["value"]["code"],
//!     "idempotency_key_reuse",
//! );
//! ```

use crate::idempotency::IDEMPOTENCY_KEY;
use crate::response::Responder;
use crate::{ErrorFormat, IdempotencyLayer, Refusal, MAX_KEY_LEN, MIN_KEY_LEN};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::Empty;
use serde_json::Value;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Components, Content, OpenApi, Ref, RefOr, Required, Response};
use utoipa::Modify;

/// Every refusal the idempotency layer answers with.
const REFUSALS: [Refusal; 16] = [
    Refusal::KeyRequired,
    Refusal::KeyInvalid,
    Refusal::KeyRepeated,
    Refusal::Unauthorized,
    Refusal::PayloadTooLarge,
    Refusal::BodyTimeout,
    Refusal::BodyUnreadable,
    Refusal::KeyReused,
    Refusal::InProgress,
    Refusal::ResponseUnavailable,
    Refusal::StoreUnavailable,
    Refusal::OutcomeUnknown,
    Refusal::QuotaExceeded,
    Refusal::Overloaded,
    Refusal::HandlerFailed,
    Refusal::KeyExpired,
];

/// Where `refusal` is in [`REFUSALS`]: an exhaustive match, so that a new
/// variant does not compile until it is listed here, and (checked below, at
/// compile time) in the list.
const fn position(refusal: Refusal) -> usize {
    match refusal {
        Refusal::KeyRequired => 0,
        Refusal::KeyInvalid => 1,
        Refusal::KeyRepeated => 2,
        Refusal::Unauthorized => 3,
        Refusal::PayloadTooLarge => 4,
        Refusal::BodyTimeout => 5,
        Refusal::BodyUnreadable => 6,
        Refusal::KeyReused => 7,
        Refusal::InProgress => 8,
        Refusal::ResponseUnavailable => 9,
        Refusal::StoreUnavailable => 10,
        Refusal::OutcomeUnknown => 11,
        Refusal::QuotaExceeded => 12,
        Refusal::Overloaded => 13,
        Refusal::HandlerFailed => 14,
        Refusal::KeyExpired => 15,
        // The lease layer's: not answered by the routes documented here.
        Refusal::JobStoreUnavailable | Refusal::BudgetExhausted => usize::MAX,
    }
}

const _: () = {
    let mut i = 0;
    while i < REFUSALS.len() {
        assert!(
            position(REFUSALS[i]) == i,
            "REFUSALS lists each refusal once"
        );
        i += 1;
    }
};

/// The OpenAPI name of the replay header.
const REPLAYED: &str = "Idempotent-Replayed";
/// The OpenAPI name of the retention header.
const RETENTION: &str = "Idempotency-Key-Retention";
/// The OpenAPI name of the header on a `2xx` the record policy declined.
const STATUS: &str = "Idempotency-Status";

/// Documents the routes an [`IdempotencyLayer`] guards in an OpenAPI
/// document: apply it with [`Modify::modify`] (or as a `modifiers(...)`
/// entry of `#[derive(utoipa::OpenApi)]`). See the [module docs](self).
#[derive(Clone, Debug)]
pub struct IdempotencyDoc {
    paths: Vec<String>,
    header: String,
    methods: Vec<Method>,
    responder: Responder,
    /// Whether the retention header is sent, and its value if known.
    retention: Option<Option<u64>>,
}

impl IdempotencyDoc {
    /// The guarded paths, as the document names them (`/v1/orders`,
    /// `/v1/orders/{id}`), documented with the layer's defaults until
    /// [`with_layer`](Self::with_layer) says otherwise.
    pub fn for_paths<I, S>(paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            paths: paths.into_iter().map(Into::into).collect(),
            header: "Idempotency-Key".to_owned(),
            methods: vec![Method::POST, Method::PATCH],
            responder: Responder::default(),
            retention: Some(None),
        }
    }

    /// Documents what `layer` is configured to do: its key header, its
    /// methods, its error format and key-reuse status, and whether it sends
    /// `Idempotency-Key-Retention` (with its store's value).
    pub fn with_layer<E, P>(mut self, layer: &IdempotencyLayer<E, P>) -> Self {
        let config = &layer.config;
        if config.header != IDEMPOTENCY_KEY {
            self.header = config.header.as_str().to_owned();
        }
        self.methods = config.options.methods.clone();
        self.responder = Responder {
            hook: None,
            ..config.options.responder.clone()
        };
        self.retention = config
            .retention_header
            .as_ref()
            .map(|value| value.to_str().ok().and_then(|v| v.parse().ok()));
        self
    }

    /// Adds the layer's header parameter, response headers and refusals to
    /// every guarded operation of `api`; returns how many it documented
    /// (a path or method the document does not have documents nothing).
    fn apply(&self, api: &mut OpenApi) -> usize {
        let mut documented = 0;
        for path in &self.paths {
            let Some(item) = api.paths.paths.get_mut(path) else {
                continue;
            };
            for method in &self.methods {
                if let Some(operation) = operation_mut(item, method) {
                    self.document_operation(operation);
                    documented += 1;
                }
            }
        }
        if documented > 0 {
            let components = api.components.get_or_insert_with(Components::new);
            for refusal in REFUSALS {
                components
                    .schemas
                    .insert(schema_name(refusal), self.refusal_schema(refusal).into());
            }
        }
        documented
    }

    fn document_operation(&self, operation: &mut Operation) {
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        parameters.retain(|p| {
            !(p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case(&self.header))
        });
        parameters.push(self.key_parameter());

        for (status, response) in operation.responses.responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                self.add_response_headers(response);
            }
        }
        let mut by_status: BTreeMap<StatusCode, Vec<Refusal>> = BTreeMap::new();
        for refusal in REFUSALS {
            by_status
                .entry(self.responder.status(refusal))
                .or_default()
                .push(refusal);
        }
        for (status, refusals) in by_status {
            // One the application documents itself is left as it is.
            let status = status.as_u16().to_string();
            if let Entry::Vacant(slot) = operation.responses.responses.entry(status) {
                slot.insert(self.refusal_response(&refusals).into());
            }
        }
    }

    fn key_parameter(&self) -> Parameter {
        let token = format!("[A-Za-z0-9._-]{{{MIN_KEY_LEN},{MAX_KEY_LEN}}}");
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!("^(?:{token}|\"{token}\")$")))
            .examples(["order-7f3a9c2e"]);
        ParameterBuilder::new()
            .name(&self.header)
            .parameter_in(ParameterIn::Header)
            .required(Required::True)
            .description(Some(format!(
                "Names the operation: a new key (a UUID) per operation, the same one on \
                 each of its retries. {MIN_KEY_LEN} to {MAX_KEY_LEN} characters of \
                 `[A-Za-z0-9._-]`, bare or as an RFC 8941 sf-string (`\"...\"`). A retry of \
                 the same request replays the recorded response; the same key with another \
                 request is refused."
            )))
            .schema(Some(schema))
            .build()
    }

    fn add_response_headers(&self, response: &mut Response) {
        let replayed = HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["true"])),
            )
            .description(Some(
                "`true` when this is the recorded response of an earlier request with the \
                 same key, replayed; absent on the first answer.",
            ))
            .build();
        response.headers.insert(REPLAYED.to_owned(), replayed);
        let not_recorded = HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["not-recorded"])),
            )
            .description(Some(
                "`not-recorded` when the server did not record this response: a retry with \
                 the same key runs the operation again. Absent on recorded responses and \
                 their replays.",
            ))
            .build();
        response.headers.insert(STATUS.to_owned(), not_recorded);
        let Some(value) = self.retention else {
            return;
        };
        let mut schema = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0));
        if let Some(seconds) = value {
            schema = schema.examples([seconds]);
        }
        let retention = HeaderBuilder::new()
            .schema(schema)
            .description(Some(
                "How many seconds the server keeps this key's record after its first \
                 response was recorded: within that time a retry with the same key replays \
                 it. The same value on the first answer and on every replay.",
            ))
            .build();
        response.headers.insert(RETENTION.to_owned(), retention);
    }

    fn refusal_response(&self, refusals: &[Refusal]) -> Response {
        let codes: Vec<String> = refusals
            .iter()
            .map(|r| format!("`{}`", self.label(*r)))
            .collect();
        let mut response = Response::new(format!(
            "Refused by the idempotency layer: {}.",
            codes.join(", ")
        ));
        let schema: RefOr<Schema> = match refusals {
            [one] => Ref::from_schema_name(schema_name(*one)).into(),
            many => many
                .iter()
                .fold(OneOfBuilder::new(), |one_of, r| {
                    one_of.item(Ref::from_schema_name(schema_name(*r)))
                })
                .into(),
        };
        let mut content = Content::new(Some(schema));
        for refusal in refusals {
            let example = ExampleBuilder::new()
                .summary(self.label(*refusal))
                .value(Some(self.body(*refusal)))
                .build();
            content
                .examples
                .insert(self.label(*refusal), example.into());
        }
        response
            .content
            .insert(self.media_type().to_owned(), content);
        if refusals.iter().any(|r| r.is_retryable()) {
            let retry_after = HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some(format!(
                    "Seconds to wait before retrying the same request with the same key; \
                     sent with {}.",
                    refusals
                        .iter()
                        .filter(|r| r.is_retryable())
                        .map(|r| format!("`{}`", self.responder.code(*r)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
                .build();
            response
                .headers
                .insert("Retry-After".to_owned(), retry_after);
        }
        response
    }

    fn media_type(&self) -> &'static str {
        match self.responder.format {
            ErrorFormat::Problem => "application/problem+json",
            ErrorFormat::Json => "application/json",
        }
    }

    /// The default body of `refusal`, as the layer sends it.
    fn body(&self, refusal: Refusal) -> Value {
        use http_body::Body;
        // A refusal's body is whole: ready at its first poll.
        let mut body = self.responder.refuse::<Empty<Bytes>>(refusal).into_body();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let frame = std::pin::Pin::new(&mut body).poll_frame(&mut cx);
        let data = match frame {
            std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
            _ => Bytes::new(),
        };
        serde_json::from_slice(&data).unwrap_or(Value::Null)
    }

    fn refusal_schema(&self, refusal: Refusal) -> Schema {
        let string = || ObjectBuilder::new().schema_type(Type::String);
        let code = string()
            .enum_values(Some([self.responder.code(refusal)]))
            .description(Some("What was refused, for programs."));
        let status = self.responder.status(refusal);
        let mut schema = ObjectBuilder::new()
            .schema_type(Type::Object)
            .title(Some(self.label(refusal)))
            .description(Some(format!(
                "`{} {}`: {}",
                status.as_u16(),
                self.label(refusal),
                refusal.message()
            )))
            .property("code", code)
            .required("code");
        if let Some(reason) = refusal.reason() {
            let reason = string().enum_values(Some([reason])).description(Some(
                "Which problem with the key, for programs to branch on.",
            ));
            schema = schema.property("reason", reason).required("reason");
        }
        let schema = match self.responder.format {
            ErrorFormat::Problem => schema
                .property("type", string().enum_values(Some([refusal.problem_type()])))
                .property("title", string())
                .property(
                    "status",
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .enum_values(Some([status.as_u16()])),
                )
                .property("detail", string().description(Some("For people.")))
                .required("type")
                .required("title")
                .required("status")
                .required("detail"),
            ErrorFormat::Json => schema
                .property("message", string().description(Some("For people.")))
                .required("message"),
        };
        schema.examples([self.body(refusal)]).into()
    }
}

impl Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        if self.apply(openapi) == 0 {
            tracing::warn!(
                "the OpenAPI document has none of the guarded paths and methods: \
                 nothing was documented (check `IdempotencyDoc::for_paths`)"
            );
        }
    }
}

impl IdempotencyDoc {
    /// What names `refusal` in the document: its code, and its reason when
    /// it has one (`idempotency_key_required (invalid)`), since key refusals
    /// may share a code.
    fn label(&self, refusal: Refusal) -> String {
        let code = self.responder.code(refusal);
        match refusal.reason() {
            Some(reason) => format!("{code} ({reason})"),
            None => code.to_owned(),
        }
    }
}

/// The component name of `refusal`'s body schema: one per refusal, whatever
/// codes the layer answers with.
fn schema_name(refusal: Refusal) -> String {
    match refusal.reason() {
        Some(reason) => format!("IdempotencyRefusal.{}.{reason}", refusal.code()),
        None => format!("IdempotencyRefusal.{}", refusal.code()),
    }
}

fn operation_mut<'a>(item: &'a mut PathItem, method: &Method) -> Option<&'a mut Operation> {
    let slot = match *method {
        Method::POST => &mut item.post,
        Method::PATCH => &mut item.patch,
        Method::PUT => &mut item.put,
        Method::DELETE => &mut item.delete,
        Method::GET => &mut item.get,
        Method::HEAD => &mut item.head,
        Method::OPTIONS => &mut item.options,
        Method::TRACE => &mut item.trace,
        _ => return None,
    };
    slot.as_mut()
}
