/*
 * The one thing the allocator needs that stable Rust cannot say: a thread-local variable with the
 * initial-exec TLS model. Rust reaches it with a two-instruction GOTTPOFF sequence (src/tls.rs),
 * so neither face of the allocator calls __tls_get_addr (which may itself call malloc) on its
 * fast path.
 *
 * The table starts as zeroes, which the Rust side reads as "no current arena and no free slot in
 * any class": a thread's very first malloc finds an empty free list and falls into the slow path
 * through the ordinary refill branch, so the fast path has no initialisation check. The initial
 * image is plain data: nothing to relocate or run per thread. Hidden visibility keeps a second
 * copy of the allocator in the same process (a Rust program using the GlobalAlloc face, run
 * under LD_PRELOAD) on its own table.
 */
struct tp_thread_block {
    unsigned char table[TP_THREAD_TABLE_BYTES];
};

__attribute__((visibility("hidden"), tls_model("initial-exec"), aligned(64)))
__thread struct tp_thread_block tp_thread_table;
