/*
 * The one thing the allocator needs that stable Rust cannot say: a thread-local variable with the
 * initial-exec TLS model. Rust reaches it with a two-instruction GOTTPOFF sequence (src/tls.rs),
 * so neither face of the allocator calls __tls_get_addr (which may itself call malloc) on its
 * fast path.
 *
 * The table starts as zeroes (.tbss, nothing to relocate, nothing to run per thread). The Rust
 * side reads zero as "every size class points at the static empty arena", so a thread's very
 * first malloc falls into the slow path through the ordinary "arena full" branch: the fast path
 * has no initialisation check. Hidden visibility keeps a second copy of the allocator in the same
 * process (a Rust program using the GlobalAlloc face, run under LD_PRELOAD) on its own table.
 */
__attribute__((visibility("hidden"), tls_model("initial-exec"), aligned(64)))
__thread unsigned char tp_thread_table[TP_THREAD_TABLE_BYTES];
