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

/// The 99 TPC-DS queries as DuckDB's `tpcds_queries()` gives them, by name (`q01` ... `q99`); the
/// data comes from `scripts/gen_tpcds.py`.
pub const TPCDS: &[(&str, &str)] = suite!("tpcds":
    "q01", "q02", "q03", "q04", "q05", "q06", "q07", "q08", "q09", "q10", "q11", "q12", "q13",
    "q14", "q15", "q16", "q17", "q18", "q19", "q20", "q21", "q22", "q23", "q24", "q25", "q26",
    "q27", "q28", "q29", "q30", "q31", "q32", "q33", "q34", "q35", "q36", "q37", "q38", "q39",
    "q40", "q41", "q42", "q43", "q44", "q45", "q46", "q47", "q48", "q49", "q50", "q51", "q52",
    "q53", "q54", "q55", "q56", "q57", "q58", "q59", "q60", "q61", "q62", "q63", "q64", "q65",
    "q66", "q67", "q68", "q69", "q70", "q71", "q72", "q73", "q74", "q75", "q76", "q77", "q78",
    "q79", "q80", "q81", "q82", "q83", "q84", "q85", "q86", "q87", "q88", "q89", "q90", "q91",
    "q92", "q93", "q94", "q95", "q96", "q97", "q98", "q99",
);

/// A suite by name.
pub fn suite(name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match name {
        "ssb" => Some(SSB),
        "tpch" => Some(TPCH),
        "tpcds" => Some(TPCDS),
        _ => None,
    }
}
