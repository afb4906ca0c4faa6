//! glibc's allocator, tuned for a build: batches are made on one thread and freed on another, and
//! glibc keeps freed memory in per-thread arenas (up to 8 per core), so without a limit the peak
//! resident size of a build is far above what it ever holds at once.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
        fn malloc_trim(pad: usize) -> i32;
    }
    const M_ARENA_MAX: i32 = -8;

    /// Let threads created from now on share two arenas.
    pub fn limit_arenas() {
        // SAFETY: mallopt only changes allocator tuning; M_ARENA_MAX affects arenas created later.
        unsafe {
            mallopt(M_ARENA_MAX, 2);
        }
    }

    /// Return free heap memory to the system (between the window pass and the output pass).
    pub fn trim() {
        // SAFETY: malloc_trim only releases free memory; it has no preconditions.
        unsafe {
            malloc_trim(0);
        }
    }
}

pub(super) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::limit_arenas();
}

pub(super) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::trim();
}
