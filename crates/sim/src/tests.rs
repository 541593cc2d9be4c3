//! Tests of the simulator as a whole: the strategies side by side in one simulated cluster.

mod fuzz;
mod groups;
mod kueue;
mod lifecycle;
mod reserved;
mod spot;
mod topology;
