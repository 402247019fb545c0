//! End-to-end tests of the sort-reducer against an in-memory `BTreeMap` reference.

use std::collections::BTreeMap;
use std::path::Path;

use quarry_sortreduce::{
    Error, Key, SortReduceConfig, SortReduceStats, SortReducer, TEMP_DIR_PREFIX, Value,
    clean_stale_temp_dirs,
};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// Small buffers so that tiny budgets still produce many runs at the full fan-in.
fn small(budget: usize, fan_in: usize, dir: &Path) -> SortReduceConfig {
    SortReduceConfig::new(budget)
        .with_fan_in(fan_in)
        .with_threads(2)
        .with_io_buffer_bytes(4096)
        .with_temp_dir(dir)
}

fn reference<K: Key, V: Value>(updates: &[(K, V)], f: impl Fn(V, V) -> V) -> Vec<(K, V)> {
    let mut map = BTreeMap::new();
    for &(k, v) in updates {
        map.entry(k)
            .and_modify(|old| *old = f(*old, v))
            .or_insert(v);
    }
    map.into_iter().collect()
}

/// Sort-reduces `updates` (pushed one by one and in batches of varying size) and checks the
/// result against the reference with `same`, the budget, the statistics, and that no temporary
/// file survives. Returns the final statistics.
fn check<K, V, F>(
    config: SortReduceConfig,
    updates: &[(K, V)],
    f: F,
    same: impl Fn(V, V) -> bool,
) -> SortReduceStats
where
    K: Key,
    V: Value,
    F: Fn(V, V) -> V + Send + Sync + Copy,
{
    let temp_dir = config.temp_dir.clone();
    let budget = config.memory_budget_bytes;
    let mut reducer = SortReducer::new(config, f).unwrap();
    let mut rest = updates;
    let mut step = 1;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        if n % 2 == 0 {
            reducer.push_batch(&rest[..n]).unwrap();
        } else {
            for &(k, v) in &rest[..n] {
                reducer.push(k, v).unwrap();
            }
        }
        rest = &rest[n..];
        step = step * 3 % 10_007 + 1;
    }
    assert_eq!(reducer.stats().updates_in, updates.len() as u64);
    let mut run = reducer.finish().unwrap();
    let mut got = Vec::new();
    while let Some(item) = run.next_record().unwrap() {
        got.push(item);
    }
    assert!(run.next_record().unwrap().is_none());
    assert!(run.spill_dir().is_none());
    assert_eq!(
        entries(&temp_dir),
        0,
        "temporary files left in {}",
        temp_dir.display()
    );
    let stats = run.stats();
    drop(run);

    let want = reference(updates, f);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.0, w.0);
        assert!(
            same(g.1, w.1),
            "key {:?}: got {:?}, want {:?}",
            g.0,
            g.1,
            w.1
        );
    }

    assert!(
        stats.peak_reserved <= budget,
        "peak {} > budget {budget}",
        stats.peak_reserved
    );
    assert_eq!(stats.memory_budget_bytes, budget);
    assert_eq!(stats.updates_in, updates.len() as u64);
    assert_eq!(stats.records_out, want.len() as u64);
    // Every byte written to a run is read back exactly once.
    assert_eq!(stats.bytes_read, stats.bytes_written);
    assert!(stats.records_after_first_reduce <= stats.updates_in);
    assert!(stats.records_after_first_reduce >= stats.records_out);
    if updates.is_empty() {
        assert_eq!(
            stats,
            SortReduceStats {
                memory_budget_bytes: budget,
                ..Default::default()
            }
        );
    } else {
        // Every chunk but the last was spilled; intermediate merges wrote the other runs.
        assert_eq!(
            stats.runs_written,
            stats.chunks_sorted - 1 + stats.intermediate_merges
        );
        assert!(stats.peak_reserved > 0);
    }
    stats
}

fn random_updates<K: Key>(
    n: usize,
    key_range: u64,
    seed: u64,
    key: impl Fn(u64) -> K,
) -> Vec<(K, u64)> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (key(rng.below(key_range)), rng.below(1 << 40)))
        .collect()
}

#[test]
fn u64_keys_sum_match_reference_with_fan_in_2_and_16() {
    let add = |a: u64, b: u64| a.wrapping_add(b);
    for fan_in in [2, 16] {
        for (i, n) in [0, 1, 2, 1000, 50_000, 200_000].into_iter().enumerate() {
            let tmp = tempfile::tempdir().unwrap();
            let updates = random_updates(n, (n as u64 / 2).max(1), i as u64, |k| k * 7919);
            let stats = check(
                small(64 << 10, fan_in, tmp.path()),
                &updates,
                add,
                |a, b| a == b,
            );
            if n == 200_000 {
                assert!(stats.runs_written > 16, "{stats:?}");
                if fan_in == 2 {
                    assert!(stats.merge_passes >= 4, "{stats:?}");
                }
            }
        }
    }
}

#[test]
fn several_passes_at_fan_in_16() {
    let tmp = tempfile::tempdir().unwrap();
    // 12 KiB-record chunks of 16-byte records: ~330 spilled runs, more than 16 * 16.
    let updates = random_updates(4_000_000, u64::MAX, 11, |k| k);
    let config = small(256 << 10, 16, tmp.path());
    let stats = check(
        config,
        &updates,
        |a: u64, b: u64| a.wrapping_add(b),
        |a, b| a == b,
    );
    assert!(stats.chunks_sorted > 256, "{stats:?}");
    assert!(stats.merge_passes >= 3, "{stats:?}");
    assert!(stats.final_merge_inputs <= 16 + 2, "{stats:?}");
}

#[test]
fn u32_keys_min_values() {
    let min = |a: u32, b: u32| a.min(b);
    for (fan_in, n) in [(2, 30_000), (16, 150_000), (3, 77_777)] {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(n as u64);
        let updates: Vec<(u32, u32)> = (0..n)
            .map(|_| (rng.below(20_000) as u32, rng.next() as u32))
            .collect();
        check(
            small(48 << 10, fan_in, tmp.path()),
            &updates,
            min,
            |a, b| a == b,
        );
    }
}

#[test]
fn f64_sums_match_within_rounding() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(5);
    let updates: Vec<(u32, f64)> = (0..120_000)
        .map(|_| (rng.below(3000) as u32, rng.below(1 << 20) as f64 / 7.0))
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    for fan_in in [2, 16] {
        check(
            small(40 << 10, fan_in, tmp.path()),
            &updates,
            |a: f64, b: f64| a + b,
            close,
        );
    }
}

#[test]
fn pair_values_keep_the_lexicographic_minimum() {
    // BFS-style (depth, parent): the smallest depth wins, ties broken by the smallest parent.
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(9);
    let updates: Vec<(u64, (u32, u32))> = (0..100_000)
        .map(|_| {
            (
                rng.below(10_000),
                (rng.below(8) as u32, rng.below(1 << 30) as u32),
            )
        })
        .collect();
    let min = |a: (u32, u32), b: (u32, u32)| a.min(b);
    check(small(64 << 10, 4, tmp.path()), &updates, min, |a, b| a == b);
}

#[test]
fn unit_values_deduplicate_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(2);
    let updates: Vec<(u32, ())> = (0..100_000)
        .map(|_| (rng.below(30_000) as u32, ()))
        .collect();
    check(
        small(40 << 10, 3, tmp.path()),
        &updates,
        |(), ()| (),
        |(), ()| true,
    );
}

#[test]
fn exhausted_inputs_and_duplicates_across_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small(64 << 10, 4, tmp.path());
    let chunk = SortReducer::<u32, u64, fn(u64, u64) -> u64>::new(config.clone(), |a, b| a + b)
        .unwrap()
        .chunk_capacity();
    let mut updates = Vec::new();
    // A full run of spread-out keys, then a run that reduces to only three records (one of them
    // larger than every other key), then runs that repeat keys of the first one, then a run of
    // keys that are all below everything else, and a short last chunk.
    updates.extend((0..chunk as u32).map(|i| (i * 1000, 1u64)));
    updates.extend((0..chunk as u32).map(|i| ([5000, 7, u32::MAX][i as usize % 3], 2)));
    for round in 0..5u32 {
        updates.extend((0..chunk as u32).map(|i| ((i * 7 + round) % chunk as u32 * 1000, 3)));
    }
    updates.extend((0..chunk as u32).map(|i| (i % 100, 4)));
    updates.extend([(u32::MAX, 5), (0, 5), (999, 5)]);
    for fan_in in [2, 3, 4] {
        check(
            config.clone().with_fan_in(fan_in),
            &updates,
            |a, b| a + b,
            |a, b| a == b,
        );
    }
}

#[test]
fn empty_input_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let reducer =
        SortReducer::<u64, u64, _>::new(small(64 << 10, 16, tmp.path()), |a, b| a + b).unwrap();
    assert_eq!(reducer.memory_budget().peak_reserved(), 0);
    let mut run = reducer.finish().unwrap();
    assert!(run.next().is_none());
    assert_eq!(run.stats().merge_passes, 0);
    assert_eq!(entries(tmp.path()), 0);
}

#[test]
fn single_key_reduces_to_one_record_per_run() {
    let tmp = tempfile::tempdir().unwrap();
    let updates = vec![(42u64, 3u64); 100_000];
    let stats = check(
        small(32 << 10, 2, tmp.path()),
        &updates,
        |a, b| a + b,
        |a, b| a == b,
    );
    assert!(stats.chunks_sorted > 50, "{stats:?}");
    // Each chunk reduces to one record per sorting thread at most.
    assert!(stats.records_after_first_reduce <= 2 * stats.chunks_sorted);
    assert!(stats.first_reduce_ratio() > 0.99);
    let tmp = tempfile::tempdir().unwrap();
    check(
        small(32 << 10, 2, tmp.path()),
        &[(7u32, 1u32)],
        |a, b| a + b,
        |a, b| a == b,
    );
}

#[test]
fn u64_sums_are_identical_for_any_thread_count() {
    let updates = random_updates(300_000, 40_000, 3, |k| k as u32);
    let mut results = Vec::new();
    for threads in [1, 2, 3, 8] {
        let tmp = tempfile::tempdir().unwrap();
        let config = small(1 << 20, 16, tmp.path()).with_threads(threads);
        let mut reducer = SortReducer::new(config, |a: u64, b: u64| a + b).unwrap();
        reducer.push_batch(&updates).unwrap();
        results.push(reducer.finish().unwrap().into_vec().unwrap());
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(results[0], reference(&updates, |a, b| a + b));
}

#[test]
fn skewed_updates_are_mostly_reduced_before_the_first_write() {
    // Power-law-like destinations, as in Kronecker and real-world graphs.
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(8);
    let updates: Vec<(u32, u32)> = (0..500_000)
        .map(|_| {
            let scale = rng.below(12) + 1;
            (rng.below(1 << scale) as u32, 1)
        })
        .collect();
    let stats = check(
        small(256 << 10, 16, tmp.path()),
        &updates,
        |a, b| a + b,
        |a, b| a == b,
    );
    assert!(stats.runs_written > 0);
    assert!(stats.first_reduce_ratio() > 0.8, "{stats:?}");
    assert!(stats.bytes_written < 500_000 * 8 / 5, "{stats:?}");
}

#[test]
fn small_budget_reduces_the_fan_in_and_stays_within_budget() {
    let tmp = tempfile::tempdir().unwrap();
    // 1 MiB with the default 1 MiB buffers: 64 KiB buffers and a fan-in of 7.
    let config = SortReduceConfig::new(1 << 20)
        .with_threads(2)
        .with_temp_dir(tmp.path());
    let reducer =
        SortReducer::<u64, u64, fn(u64, u64) -> u64>::new(config.clone(), |a, b| a + b).unwrap();
    assert_eq!(reducer.effective_fan_in(), 7);
    assert_eq!(reducer.io_buffer_bytes(), 64 << 10);
    let updates = random_updates(1_000_000, 1 << 40, 4, |k| k);
    let stats = check(config, &updates, |a, b| a + b, |a, b| a == b);
    assert!(stats.intermediate_merges > 0, "{stats:?}");
}

#[test]
fn dropping_midway_removes_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    let updates = random_updates(100_000, 1 << 30, 6, |k| k);

    // Dropped before `finish`.
    let mut reducer = SortReducer::new(small(64 << 10, 4, tmp.path()), |a: u64, b| a + b).unwrap();
    reducer.push_batch(&updates).unwrap();
    let dir = reducer.spill_dir().unwrap().to_path_buf();
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(TEMP_DIR_PREFIX)
    );
    assert!(entries(&dir) > 4);
    drop(reducer);
    assert_eq!(entries(tmp.path()), 0);

    // Dropped while the final merge streams.
    let mut reducer = SortReducer::new(small(64 << 10, 4, tmp.path()), |a: u64, b| a + b).unwrap();
    reducer.push_batch(&updates).unwrap();
    let mut run = reducer.finish().unwrap();
    for _ in 0..10 {
        run.next().unwrap().unwrap();
    }
    let dir = run.spill_dir().unwrap().to_path_buf();
    assert!(entries(&dir) > 0 && entries(&dir) <= 4);
    assert!(run.memory_budget().reserved() > 0);
    let budget = run.memory_budget().clone();
    drop(run);
    assert_eq!(entries(tmp.path()), 0);
    assert_eq!(budget.reserved(), 0);
}

#[test]
fn invalid_configurations_are_errors() {
    let make = |config: SortReduceConfig| {
        SortReducer::<u32, u32, _>::new(config, |a, b| a + b)
            .err()
            .unwrap()
    };
    assert!(matches!(
        make(SortReduceConfig::new(1 << 20).with_fan_in(1)),
        Error::Config(_)
    ));
    assert!(matches!(make(SortReduceConfig::new(100)), Error::Config(_)));
    let unwritable = SortReduceConfig::new(64 << 10)
        .with_io_buffer_bytes(4096)
        .with_temp_dir("/proc/quarry-sortreduce-cannot-create-this");
    let mut reducer = SortReducer::new(unwritable, |a: u32, b| a + b).unwrap();
    let err = reducer.push_batch(&vec![(1, 1); 100_000]).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("/proc/quarry-sortreduce-cannot-create-this"),
        "{err}"
    );
    // The chunk may be half sorted now: the reducer refuses to go on.
    assert!(matches!(reducer.push(1, 1), Err(Error::Poisoned)));
    assert!(matches!(reducer.finish().err().unwrap(), Error::Poisoned));
}

const CHILD_ENV: &str = "QUARRY_SORTREDUCE_KILLED_CHILD_DIR";

/// Helper run in a child process by `killed_process_leaves_nothing_after_cleanup`: spills runs,
/// then aborts (no destructors run), as a killed process would.
#[test]
#[ignore = "run only as a child process"]
fn killed_child_helper() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut reducer =
        SortReducer::new(small(64 << 10, 4, Path::new(&dir)), |a: u64, b| a + b).unwrap();
    reducer
        .push_batch(&random_updates(50_000, 1 << 30, 1, |k| k))
        .unwrap();
    assert!(reducer.spill_dir().is_some());
    std::process::abort();
}

#[test]
fn killed_process_leaves_nothing_after_cleanup() {
    let tmp = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_child_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(entries(&left[0]) > 0);

    // A live reducer of this process is left alone.
    let mut live = SortReducer::new(small(64 << 10, 4, tmp.path()), |a: u64, b| a + b).unwrap();
    live.push_batch(&random_updates(50_000, 1 << 30, 1, |k| k))
        .unwrap();
    assert_eq!(clean_stale_temp_dirs(tmp.path()).unwrap(), 1);
    assert!(!left[0].exists());
    assert!(live.spill_dir().unwrap().exists());
    assert_eq!(clean_stale_temp_dirs(tmp.path()).unwrap(), 0);
}
