//! Models that explain Quarry's runs.
//!
//! - [`emos`]: EMOS (Li 2018, ch. 4.4.2), the trace-driven storage-energy simulator: timestamped
//!   read and write requests through an LRU page cache, each request's energy from the
//!   platform's measured energy per KB (Table 4.4).
//! - [`kim`]: Kim 2015's analytical model of scans and joins on the host, the SSD's embedded CPU
//!   or its flash controllers' logic (eq. (1)-(23)), with Table 3 reproduced.
//! - [`layout`]: the layout planner's model (HippogriffDB, Li 2018 ch. 2.2): a column layout
//!   per column for a workload on a device, greedy within twice the optimum.
//! - [`sharing`]: fragments that run at once sharing the link and the host's threads: each
//!   one's time alone, stretched over a run's schedule.
//! - [`energy`]: a query's energy by component from the work it did (bytes read, moved and
//!   written, CPU time on device and host) and the power figures of its device profiles.

pub mod emos;
pub mod energy;
pub mod kim;
pub mod layout;
pub mod sharing;
