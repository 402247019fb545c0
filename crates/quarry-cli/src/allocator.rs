//! The process's allocator: mimalloc (v3).
//!
//! With the system allocator, a scan's large short-lived buffers were mapped and zeroed by the
//! kernel anew each time: a third of a scan's time went to page faults and clearing (perf, SSB
//! SF 10). mimalloc keeps freed memory for reuse, by default for a second. Commands bound to a
//! memory budget (graph analytics) instead return freed memory at once, so the process's
//! resident size follows the budget (tests/python/test_graph.py pins it); SQL keeps the default,
//! which returning at once slowed by 20-40% (SSB q1.1 565 -> 791 ms).
//!
//! Transparent huge pages are off for the whole process. mimalloc asks for them on its arenas;
//! a huge-page fault zeroes 2 MB (and, with the kernel's default `defrag=madvise`, may compact
//! memory first), and purging part of one splits it, so a scan's stream of short-lived buffers
//! zeroed many times the memory it used. perf, SSB q4.1 at SF 10: `clear_page_erms` was 18-32%
//! of the samples with huge pages and under 1% without; the run took 30% fewer CPU samples,
//! and its time stopped swinging between 0.85 and 1.3 s after another process's run.

use libmimalloc_sys::{_mi_option_last, mi_option_set, mi_option_t};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc v3's option numbers (`mi_option_e` in mimalloc.h); the bindings name only some.
const PURGE_DELAY: mi_option_t = 15;
const _: () = assert!(_mi_option_last == 47, "mimalloc's option numbering changed: check the option numbers above");

/// No transparent huge pages for this process (see the module docs); call first thing.
pub fn disable_transparent_huge_pages() {
    // SAFETY: the prctl only changes how this process's future page faults are served.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Freed memory goes back to the OS at once (in small pages, see
/// [`disable_transparent_huge_pages`]: a huge page stays resident until all of it is free).
pub fn return_freed_memory_at_once() {
    // SAFETY: setting an option is a plain store mimalloc reads on its next purge.
    unsafe {
        mi_option_set(PURGE_DELAY, 0);
    }
}
