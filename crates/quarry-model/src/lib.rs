//! Models that explain Quarry's runs.
//!
//! - [`emos`]: EMOS (Li 2018, ch. 4.4.2), the trace-driven storage-energy simulator: timestamped
//!   read and write requests through an LRU page cache, each request's energy from the
//!   platform's measured energy per KB (Table 4.4).
//! - [`energy`]: a query's energy by component from the work it did (bytes read, moved and
//!   written, CPU time on device and host) and the power figures of its device profiles.

pub mod emos;
pub mod energy;
