//! Cancel at every poll: the driver (`driver`), and the checks any store runs
//! after each cut, of every `Store` method (`store`) and of the layer's and
//! the engine's claimed paths (`claimed`).

#[cfg(feature = "test-util")]
pub mod claimed;
pub mod driver;
#[cfg(feature = "test-util")]
pub mod store;
