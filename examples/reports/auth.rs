//! Demo auth: the bearer token is the tenant.

use super::answers::error;
use axum::body::Body;
use axum::http::{header, HeaderMap, Request, Response, StatusCode};
use axum::response::IntoResponse;
use std::future::{ready, Ready};
use tower_http::auth::AsyncAuthorizeRequest;
use tower_idempotency::Scope;

/// Demo auth: `Authorization: Bearer <token>`, where a token of 1 to 64
/// characters `[A-Za-z0-9._-]` is the tenant id. The tenant becomes the
/// [`Scope`] the lease layer keys jobs by, and every reader checks it.
#[derive(Clone, Copy)]
pub struct BearerTenant;

impl<B: Send + 'static> AsyncAuthorizeRequest<B> for BearerTenant {
    type RequestBody = B;
    type ResponseBody = Body;
    type Future = Ready<Result<Request<B>, Response<Body>>>;

    fn authorize(&mut self, mut request: Request<B>) -> Self::Future {
        let tenant = bearer(request.headers())
            .filter(|token| is_tenant_token(token))
            .map(str::to_owned);
        ready(match tenant {
            Some(tenant) => {
                request.extensions_mut().insert(Scope::new(tenant));
                Ok(request)
            }
            None => Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send Authorization: Bearer <tenant id>",
            )
            .into_response()),
        })
    }
}

/// The token of `Authorization: Bearer <token>`.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// 1 to 64 characters `[A-Za-z0-9._-]`.
pub(super) fn is_tenant_token(token: &str) -> bool {
    (1..=64).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
