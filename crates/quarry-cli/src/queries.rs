//! The benchmark queries, compiled into the binary from `queries/` so `quarry bench` works from
//! any directory.

macro_rules! suite {
    ($dir:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../queries/", $dir, "/", $name, ".sql")))),*]
    };
}

/// The 13 Star Schema Benchmark queries, by name (`q1.1` ... `q4.3`).
pub const SSB: &[(&str, &str)] = suite!("ssb": "q1.1", "q1.2", "q1.3", "q2.1", "q2.2", "q2.3", "q3.1", "q3.2", "q3.3", "q3.4", "q4.1", "q4.2", "q4.3");

/// The 22 TPC-H queries, by name (`q01` ... `q22`).
pub const TPCH: &[(&str, &str)] = suite!("tpch":
    "q01", "q02", "q03", "q04", "q05", "q06", "q07", "q08", "q09", "q10", "q11",
    "q12", "q13", "q14", "q15", "q16", "q17", "q18", "q19", "q20", "q21", "q22");

/// A suite by name.
pub fn suite(name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match name {
        "ssb" => Some(SSB),
        "tpch" => Some(TPCH),
        _ => None,
    }
}
