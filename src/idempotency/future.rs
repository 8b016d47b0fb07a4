crate::future::response_future! {
    /// Response future of [`IdempotencyService`](crate::idempotency::IdempotencyService).
    ///
    /// Requests the layer does not apply to (by method) run the inner future
    /// directly, without allocation.
    "IdempotencyService"
}
