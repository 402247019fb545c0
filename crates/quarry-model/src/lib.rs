//! Models that explain Quarry's runs.
//!
//! - [`emos`]: EMOS (Li 2018, ch. 4.4.2), the trace-driven storage-energy simulator: timestamped
//!   read and write requests through an LRU page cache, each request's energy from the
//!   platform's measured energy per KB (Table 4.4).

pub mod emos;
