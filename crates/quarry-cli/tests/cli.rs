//! The `quarry` binary as a user runs it: loads that crash or fail leave tables intact, and bad
//! input gets one clear error line and a non-zero exit status.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn quarry(warehouse: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quarry"));
    command.arg("--warehouse").arg(warehouse).env_remove("QUARRY_FAIL_POINT");
    command
}

fn run_ok(command: &mut Command) -> String {
    let output = command.output().expect("run quarry");
    assert!(output.status.success(), "quarry failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8 output")
}

fn run_err(command: &mut Command) -> String {
    let output: Output = command.output().expect("run quarry");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "expected failure, got: {}", String::from_utf8_lossy(&output.stdout));
    assert!(!stderr.contains("panicked") && !stderr.contains("internal error") && !stderr.contains("RUST_BACKTRACE"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one error line expected: {stderr}");
    stderr
}

fn count(warehouse: &Path, table: &str) -> u64 {
    let out = run_ok(quarry(warehouse).args(["sql", &format!("SELECT count(*) AS n FROM {table}"), "--format", "csv"]));
    out.lines().nth(1).expect("a count row").trim().parse().expect("a number")
}

fn write_csv(path: &Path, rows: u64) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(file, "id,name,amount,day").unwrap();
    for i in 0..rows {
        writeln!(file, "{i},\"name {i}, with comma\",{}.{:02},1995-{:02}-{:02}", i % 1000, i % 100, i % 12 + 1, i % 28 + 1).unwrap();
    }
}

fn segment_files(warehouse: &Path, table: &str) -> Vec<PathBuf> {
    match std::fs::read_dir(warehouse.join(table).join("data")) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn kill_9_during_load_into_existing_table_keeps_the_old_table() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let small = dir.path().join("small.csv");
    let big = dir.path().join("big.csv");
    write_csv(&small, 1000);
    write_csv(&big, 3_000_000);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&small));
    assert_eq!(count(&warehouse, "t"), 1000);

    for target in ["t", "fresh"] {
        let mut child = quarry(&warehouse).args(["load", target]).arg(&big).stderr(Stdio::null()).spawn().unwrap();
        // Kill once the load has written at least one segment of the new version, so the crash
        // happens mid-load with partial files on disk.
        let before = segment_files(&warehouse, target).len();
        let deadline = Instant::now() + Duration::from_secs(60);
        while segment_files(&warehouse, target).len() <= before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(child.try_wait().unwrap().is_none(), "the load finished before it could be killed; make the input bigger");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(segment_files(&warehouse, target).len() > before, "the killed load had written a segment");
    }

    assert_eq!(count(&warehouse, "t"), 1000, "old version intact and queryable");
    let tables = run_ok(quarry(&warehouse).arg("tables"));
    assert!(tables.starts_with("t\t") && !tables.contains("fresh"), "no partial table visible: {tables}");
    assert_eq!(segment_files(&warehouse, "t").len(), 1, "leftovers removed on the next open");
    assert!(segment_files(&warehouse, "fresh").is_empty());
}

#[test]
fn crash_between_commit_steps_leaves_one_consistent_version() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let first = dir.path().join("first.csv");
    let second = dir.path().join("second.csv");
    write_csv(&first, 10);
    write_csv(&second, 20);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&first));
    // Manifest written but not yet made current: the old version stays.
    let status = quarry(&warehouse).args(["load", "t"]).arg(&second).env("QUARRY_FAIL_POINT", "after-manifest").stderr(Stdio::null()).status().unwrap();
    assert!(!status.success());
    assert_eq!(count(&warehouse, "t"), 10);
    // CURRENT swapped, cleanup not done: the new version is committed and complete.
    let status = quarry(&warehouse).args(["load", "t"]).arg(&second).env("QUARRY_FAIL_POINT", "after-commit").stderr(Stdio::null()).status().unwrap();
    assert!(!status.success());
    assert_eq!(count(&warehouse, "t"), 20);
}

#[test]
fn malformed_csv_row_names_file_line_and_column_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let good = dir.path().join("good.csv");
    write_csv(&good, 100);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&good));
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "id,name,amount,day\n1,a,2.50,1995-01-01\n2,b,oops,1995-01-02\n").unwrap();
    let err = run_err(quarry(&warehouse).args(["load", "t"]).arg(&bad).args(["--schema", "id INT, name VARCHAR, amount DECIMAL(10,2), day DATE"]));
    assert!(err.contains("bad.csv:3:3 (amount)") && err.contains("'oops'"), "{err}");
    assert_eq!(count(&warehouse, "t"), 100);
    let err = run_err(quarry(&warehouse).args(["load", "t", "--append"]).arg(&bad));
    assert!(err.contains("bad.csv:3:3"), "{err}");
    assert_eq!(count(&warehouse, "t"), 100);
}

#[test]
fn sql_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let csv = dir.path().join("t.csv");
    write_csv(&csv, 10);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&csv));
    let err = run_err(quarry(&warehouse).args(["sql", "SELECT * FROM nope"]));
    assert!(err.contains("nope") && err.contains("not found"), "{err}");
    let err = run_err(quarry(&warehouse).args(["sql", "SELECT missing FROM t"]));
    assert!(err.contains("missing"), "{err}");
    let err = run_err(quarry(&warehouse).args(["sql", "SELECT id FROM t WHERE"]));
    assert!(err.contains("syntax error") && err.contains("Line: 1"), "{err}");
    let err = run_err(quarry(&warehouse).args(["sql", "SELECT name + 1 FROM t"]));
    assert!(err.to_lowercase().contains("type") || err.contains("Cannot"), "{err}");
    let err = run_err(quarry(&warehouse).args(["sql", "CREATE TABLE x (a INT)"]));
    assert!(err.contains("quarry load"), "{err}");
}

#[test]
fn missing_segment_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let csv = dir.path().join("t.csv");
    write_csv(&csv, 10);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&csv));
    let segment = segment_files(&warehouse, "t").pop().unwrap();
    std::fs::remove_file(&segment).unwrap();
    let err = run_err(quarry(&warehouse).args(["sql", "SELECT sum(id) FROM t"]));
    assert!(err.contains(segment.file_name().unwrap().to_str().unwrap()), "{err}");
}

#[test]
fn shell_runs_multi_line_statements_and_dot_commands() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let csv = dir.path().join("t.csv");
    write_csv(&csv, 10);
    run_ok(quarry(&warehouse).args(["load", "t"]).arg(&csv));
    let mut child = quarry(&warehouse)
        .arg("shell")
        .env("HOME", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = ".tables\nSELECT count(*) AS rows_in_t,\n  sum(id) AS id_total\nFROM t;\nSELECT nope FROM t;\nSELECT 40 + 2 AS answer;\n.quit\n";
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("| t "), "table list: {stdout}");
    assert!(stdout.contains("rows_in_t") && stdout.contains("| 10 ") && stdout.contains("| 45 "), "multi-line result: {stdout}");
    assert!(stderr.contains("nope"), "an error does not end the session: {stderr}");
    assert!(stdout.contains("| 42 "), "statements after an error still run: {stdout}");
}
