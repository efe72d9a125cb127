//! The scenarios, by what they measure.

pub mod first_packet;
pub mod latency;
pub mod lifecycle;
pub mod loss;
pub mod measured;
pub mod packets;
pub mod schedule;
pub mod throughput;
pub mod topology;
