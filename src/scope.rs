//! Where a key's scope (tenant, merchant, user) comes from.

use http::request::Parts;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// The tenant an idempotency key belongs to.
///
/// Keys are unique per `(scope, key)`: two merchants may use the same key
/// string without seeing each other's responses. An authentication layer that
/// runs before the idempotency layer inserts a `Scope` into the request
/// extensions; that is where the default [`ScopeExtractor`] looks.
///
/// ```
/// use tower_idempotency::Scope;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Scope::new("merchant_42"));
/// assert_eq!(req.extensions().get::<Scope>().unwrap().as_str(), "merchant_42");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Scope(Arc<str>);

impl Scope {
    /// Creates a scope from an authenticated identity.
    pub fn new(scope: impl Into<Arc<str>>) -> Self {
        Self(scope.into())
    }

    /// The scope as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scope").field(&self.as_str()).finish()
    }
}

impl AsRef<str> for Scope {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Finds the scope of a request; `None` answers `401 unauthorized`.
///
/// Take the scope from authentication (request extensions, a verified token),
/// never from the request body: a scope a client can choose is a key another
/// tenant can replay. Closures `Fn(&http::request::Parts) -> Option<Scope>`
/// implement this trait.
///
/// ```
/// use tower_idempotency::{Scope, ScopeExtractor};
///
/// let from_header = |parts: &http::request::Parts| {
///     parts.headers.get("x-tenant")?.to_str().ok().map(Scope::new)
/// };
/// let (parts, ()) = http::Request::builder()
///     .header("x-tenant", "acme")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(from_header.extract(&parts), Some(Scope::new("acme")));
/// ```
pub trait ScopeExtractor: Clone + Send + Sync + 'static {
    /// Returns the scope of the request, or `None` when it has none.
    fn extract(&self, parts: &Parts) -> Option<Scope>;
}

impl<F> ScopeExtractor for F
where
    F: Fn(&Parts) -> Option<Scope> + Clone + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Option<Scope> {
        self(parts)
    }
}

/// Reads the scope from a value an authentication layer put into the request
/// extensions. `FromExtension::<Scope>::new()` is the layer's default.
///
/// ```
/// use tower_idempotency::{FromExtension, ScopeExtractor};
///
/// #[derive(Clone)]
/// struct MerchantId(String);
/// impl AsRef<str> for MerchantId {
///     fn as_ref(&self) -> &str { &self.0 }
/// }
///
/// let extractor = FromExtension::<MerchantId>::new();
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(MerchantId("m_1".into()));
/// let (parts, ()) = req.into_parts();
/// assert_eq!(extractor.extract(&parts).unwrap().as_str(), "m_1");
/// ```
pub struct FromExtension<T>(PhantomData<fn() -> T>);

impl<T> FromExtension<T> {
    /// Reads `T` from the request extensions.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for FromExtension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for FromExtension<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for FromExtension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromExtension<")?;
        f.write_str(std::any::type_name::<T>())?;
        f.write_str(">")
    }
}

impl<T> ScopeExtractor for FromExtension<T>
where
    T: AsRef<str> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Option<Scope> {
        let value = parts.extensions.get::<T>()?;
        if value.as_ref().is_empty() {
            return None;
        }
        // A `Scope` is shared, not copied: no allocation on the request path.
        let any: &dyn std::any::Any = value;
        Some(match any.downcast_ref::<Scope>() {
            Some(scope) => scope.clone(),
            None => Scope::new(value.as_ref()),
        })
    }
}
