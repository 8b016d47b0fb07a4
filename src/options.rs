//! What both HTTP front doors are configured with alike: the methods they
//! guard, how much of a request body they buffer and for how long, and how
//! their refusals are answered, and the setup mistakes they warned about.

use crate::limits;
use crate::response::{ErrorFormat, RefusalResponse, Responder};
use crate::warn_once::WarnOnce;
use http::Method;
use std::sync::Arc;
use std::time::Duration;

/// The default request body limit of both layers: 1 MiB.
pub(crate) const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The methods guarded; others pass through.
    pub(crate) methods: Vec<Method>,
    /// The largest request body buffered; larger ones get `413`.
    pub(crate) body_limit: usize,
    /// How long the whole request body may take to arrive.
    pub(crate) body_timeout: Option<Duration>,
    /// Builds every refusal.
    pub(crate) responder: Responder,
    /// The setup mistakes already warned about, per route.
    pub(crate) warned: WarnOnce,
}

impl Options {
    pub(crate) fn new(methods: Vec<Method>) -> Self {
        Self {
            methods,
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: None,
            responder: Responder {
                body_limit: Some(DEFAULT_BODY_LIMIT),
                ..Responder::default()
            },
            warned: WarnOnce::default(),
        }
    }

    pub(crate) fn set_methods(&mut self, methods: impl IntoIterator<Item = Method>) {
        self.methods = methods.into_iter().collect();
    }

    /// The limit, and the `413` message that names it.
    pub(crate) fn set_body_limit(&mut self, bytes: usize) {
        self.body_limit = bytes;
        self.responder.body_limit = Some(bytes);
    }

    pub(crate) fn set_body_timeout(&mut self, timeout: Duration) {
        self.body_timeout = Some(limits::clamp(timeout, Duration::ZERO));
    }

    pub(crate) fn set_error_format(&mut self, format: ErrorFormat) {
        self.responder.format = format;
    }

    pub(crate) fn set_refusal_response(&mut self, respond: impl RefusalResponse) {
        self.responder.hook = Some(Arc::new(respond));
    }
}
