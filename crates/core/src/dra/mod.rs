//! Dynamic Resource Allocation: device selectors (CEL) and the devices a new node will publish.

pub mod cel;
pub mod predict;

pub use cel::Selectors;
pub use predict::predicted_devices;
