crate::future::response_future! {
    /// Response future of [`LeaseService`](crate::lease::LeaseService).
    ///
    /// Requests the layer does not apply to (by method) run the inner future
    /// directly, without allocation.
    "LeaseService"
}
