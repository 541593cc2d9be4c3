//! Tests of the simulator as a whole: the strategies side by side in one simulated cluster.

mod reserved;
mod spot;
mod topology;
