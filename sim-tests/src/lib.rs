//! Suites that hold the broker to its contract: the conformance cases shared by every storage
//! backend, the model's property tests, and the turmoil simulation.

pub mod conformance;
pub mod fixtures;
pub mod sim;
