//! glibc's stdio streams around a fork.
//!
//! In a forked child, glibc resets the lock of every stdio stream before any fork handler runs
//! (`fresetlockfiles` in its fork), writing to each one. A stream the program opened lives in
//! memory its `fopen` allocated, so paged; and until the child's pager restarts, the child's
//! copy of the heap is not registered with any userfaultfd object, so a page of it that was
//! far reads as zeros there (the lock, and whatever else shares the page). So the pager runs
//! [`touch_locks`] in the forking thread just before the fork, once no pager work can evict
//! anything until the child's pager runs: touching each stream's lock maps its page, and the
//! child inherits it mapped.

/// Touches the lock of every open stdio stream (and the stream, to reach it).
pub(crate) fn touch_locks() {
    #[cfg(target_env = "gnu")]
    {
        // The stream list's own lock and iterator: exported by glibc for exactly this kind of
        // walk (its fork and its exit handling use them).
        extern "C" {
            fn _IO_list_lock();
            fn _IO_list_unlock();
            fn _IO_iter_begin() -> *mut libc::FILE;
            fn _IO_iter_end() -> *mut libc::FILE;
            fn _IO_iter_next(it: *mut libc::FILE) -> *mut libc::FILE;
            fn _IO_iter_file(it: *mut libc::FILE) -> *mut libc::FILE;
            fn ftrylockfile(stream: *mut libc::FILE) -> libc::c_int;
            fn funlockfile(stream: *mut libc::FILE);
        }
        // SAFETY: the list is walked under its lock; each stream on it is live until removed
        // from it, which takes the same lock. ftrylockfile never blocks: a stream another
        // thread holds is read (its page mapped) and left alone.
        unsafe {
            _IO_list_lock();
            let mut it = _IO_iter_begin();
            while it != _IO_iter_end() {
                let stream = _IO_iter_file(it);
                if ftrylockfile(stream) == 0 {
                    funlockfile(stream);
                }
                it = _IO_iter_next(it);
            }
            _IO_list_unlock();
        }
    }
}
