//! The program's code mapped ahead of its first use, on another core.
//!
//! A fresh process meets each page of its machine code the first time it runs it: a page fault
//! per 64 KB (the kernel maps that much around a fault), about a sixth of a short query's
//! planning (perf, TPC-DS SF 1: `filemap_map_pages` under SQL planning, where the other core
//! sits idle). A thread started first asks the kernel to map the whole text segment
//! (`MADV_POPULATE_READ`), which it does in large batches from the page cache (115 MB in 7 ms
//! here). TPC-DS SF 1, interleaved runs: planning 8.6 -> 7.1 ms (q12), 10.1 -> 8.3 ms (q41).
//! `QUARRY_NO_PREFAULT` turns it off, for measuring.

/// Starts mapping the executable's text in the background; does nothing where the kernel
/// cannot (before Linux 5.14) or the mapping is not found.
pub fn code_in_background() {
    let _ = std::thread::Builder::new().name("prefault".into()).spawn(|| {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
        let Ok(exe) = std::fs::read_link("/proc/self/exe") else { return };
        let exe = exe.to_string_lossy();
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
            if !perms.starts_with("r-x") || !line.ends_with(exe.as_ref()) {
                continue;
            }
            let Some((start, end)) = range.split_once('-') else { continue };
            let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else { continue };
            // SAFETY: populating page tables of a mapping this process holds changes no memory.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_READ);
            }
        }
    });
}
