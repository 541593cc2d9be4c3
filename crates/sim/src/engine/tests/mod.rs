//! The simulated cluster's tests, by subject.

mod dra;
mod scheduler;
