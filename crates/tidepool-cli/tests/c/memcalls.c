/* Every memory call real programs make, on memory larger than the local budget: each case
 * fills mappings with a pattern, makes the call, and checks every word it should see (and that
 * forbidden accesses fault). Prints "ok CASE" and exits 0, or names the first wrong word and
 * exits 1. Run natively it must say the same.
 *
 * usage: memcalls CASE MIB
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static size_t MB;  /* bytes in the case's unit */

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33; return x;
}
static uint64_t word(uint64_t seed, size_t i) { return mix(seed * 0x9E3779B97F4A7C15ULL + i); }

static void fill(void *p, size_t bytes, uint64_t seed) {
    uint64_t *m = p;
    for (size_t i = 0; i < bytes / 8; i++) m[i] = word(seed, i);
}

static int check(const char *what, const void *p, size_t bytes, uint64_t seed) {
    const uint64_t *m = p;
    for (size_t i = 0; i < bytes / 8; i++) {
        uint64_t want = seed ? word(seed, i) : 0;
        if (m[i] != want) {
            printf("%s: word %zu is %016llx, expected %016llx\n", what, i,
                   (unsigned long long)m[i], (unsigned long long)want);
            return 1;
        }
    }
    return 0;
}

static void *map(size_t len, int prot) {
    void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return p;
}

static sigjmp_buf jump;
static void on_segv(int sig) { (void)sig; siglongjmp(jump, 1); }

/* Whether reading (write=0) or writing (write=1) the byte at p faults. */
static int faults(volatile char *p, int write) {
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, &old);
    int faulted = 1;
    if (sigsetjmp(jump, 1) == 0) {
        if (write) *p = 1; else (void)*p;
        faulted = 0;
    }
    sigaction(SIGSEGV, &old, NULL);
    return faulted;
}

#define CHECK(x) do { if (x) return 1; } while (0)

static int c_mremap_grow(void) {
    char *p = map(32 * MB, PROT_READ | PROT_WRITE);
    fill(p, 32 * MB, 1);
    char *q = mremap(p, 32 * MB, 64 * MB, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) { perror("mremap"); return 1; }
    CHECK(check("grown, old part", q, 32 * MB, 1));
    CHECK(check("grown, new part", q + 32 * MB, 32 * MB, 0));
    fill(q + 32 * MB, 32 * MB, 2);
    CHECK(check("grown, old part again", q, 32 * MB, 1));
    return check("grown, new part filled", q + 32 * MB, 32 * MB, 2);
}

static int c_mremap_shrink(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 3);
    char *q = mremap(p, 64 * MB, 16 * MB, 0);
    if (q != p) { printf("shrinking moved or failed\n"); return 1; }
    CHECK(check("shrunk", p, 16 * MB, 3));
    char *r = map(48 * MB, PROT_READ | PROT_WRITE);
    CHECK(check("new mapping after the shrink", r, 48 * MB, 0));
    fill(r, 48 * MB, 4);
    return check("shrunk, after new writes elsewhere", p, 16 * MB, 3);
}

static int c_mremap_fixed(void) {
    char *a = map(32 * MB, PROT_READ | PROT_WRITE);
    char *b = map(32 * MB, PROT_READ | PROT_WRITE);
    fill(a, 32 * MB, 5);
    fill(b, 32 * MB, 6);
    char *q = mremap(a, 32 * MB, 32 * MB, MREMAP_MAYMOVE | MREMAP_FIXED, b);
    if (q != b) { printf("mremap fixed returned %p, not %p\n", (void *)q, (void *)b); return 1; }
    return check("moved over another mapping", b, 32 * MB, 5);
}

static int c_mremap_dontunmap(void) {
    char *a = map(32 * MB, PROT_READ | PROT_WRITE);
    fill(a, 32 * MB, 7);
    char *q = mremap(a, 32 * MB, 32 * MB, MREMAP_MAYMOVE | MREMAP_DONTUNMAP);
    /* glibc 2.36 with Linux 6.18 refuses it (EINVAL); where it works, it must work right. */
    if (q == MAP_FAILED && errno == EINVAL) return check("not moved", a, 32 * MB, 7);
    if (q == MAP_FAILED) { perror("mremap dontunmap"); return 1; }
    CHECK(check("moved, new place", q, 32 * MB, 7));
    CHECK(check("moved, old place reads zero", a, 32 * MB, 0));
    fill(a, 32 * MB, 8);
    CHECK(check("old place, written again", a, 32 * MB, 8));
    return check("new place, untouched by that", q, 32 * MB, 7);
}

static int c_madvise_dontneed(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 9);
    if (madvise(p + 16 * MB, 16 * MB, MADV_DONTNEED)) { perror("madvise"); return 1; }
    CHECK(check("before the dropped part", p, 16 * MB, 9));
    CHECK(check("dropped part", p + 16 * MB, 16 * MB, 0));
    uint64_t *rest = (uint64_t *)(p + 32 * MB);
    for (size_t i = 0; i < 32 * MB / 8; i++)
        if (rest[i] != word(9, i + 32 * MB / 8)) { printf("after the dropped part: word %zu\n", i); return 1; }
    return 0;
}

static int c_madvise_free(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 10);
    if (madvise(p, 32 * MB, MADV_FREE)) { perror("madvise"); return 1; }
    /* Freed pages read as their old contents or zero until written; writes after stick. */
    fill(p, 32 * MB, 11);
    CHECK(check("freed and rewritten", p, 32 * MB, 11));
    uint64_t *rest = (uint64_t *)(p + 32 * MB);
    for (size_t i = 0; i < 32 * MB / 8; i++)
        if (rest[i] != word(10, i + 32 * MB / 8)) { printf("not freed: word %zu\n", i); return 1; }
    return 0;
}

static int c_madvise_remove(void) {
    char *p = map(8 * MB, PROT_READ | PROT_WRITE);
    fill(p, 8 * MB, 12);
    int r = madvise(p, 8 * MB, MADV_REMOVE);
    printf("MADV_REMOVE on private memory: %d %s\n", r, r ? strerror(errno) : "");
    return check("after MADV_REMOVE", p, 8 * MB, 12);
}

static int c_hugepages(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    if (madvise(p, 64 * MB, MADV_HUGEPAGE)) { perror("MADV_HUGEPAGE"); return 1; }
    fill(p, 64 * MB, 13);
    CHECK(check("huge-page advised", p, 64 * MB, 13));
    if (madvise(p + 16 * MB, 16 * MB, MADV_NOHUGEPAGE)) { perror("MADV_NOHUGEPAGE"); return 1; }
    fill(p, 64 * MB, 14);
    return check("after NOHUGEPAGE on a part", p, 64 * MB, 14);
}

static int c_mprotect_readonly(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 15);
    if (mprotect(p + 16 * MB, 16 * MB, PROT_READ)) { perror("mprotect"); return 1; }
    if (!faults(p + 20 * MB, 1)) { printf("a write to a read-only page did not fault\n"); return 1; }
    if (faults(p + 20 * MB, 0)) { printf("a read of a read-only page faulted\n"); return 1; }
    /* Push everything else out and back, read-only part included. */
    char *other = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(other, 64 * MB, 16);
    CHECK(check("whole, with a read-only part", p, 64 * MB, 15));
    if (mprotect(p + 16 * MB, 16 * MB, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 1; }
    fill(p, 64 * MB, 17);
    CHECK(check("writable again", p, 64 * MB, 17));
    return check("the other mapping", other, 64 * MB, 16);
}

static int c_mprotect_guard(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 18);
    char *guard = p + 32 * MB;
    if (mprotect(guard, 4096, PROT_NONE)) { perror("mprotect"); return 1; }
    if (!faults(guard, 0) || !faults(guard + 4095, 1)) { printf("a guard page did not fault\n"); return 1; }
    /* Much more than fits, so the guard's neighbours go far and come back. */
    char *other = map(64 * MB, PROT_READ | PROT_WRITE);
    for (int round = 0; round < 2; round++) {
        fill(other, 64 * MB, 19 + round);
        CHECK(check("below the guard", p, 32 * MB, 18));
    }
    if (mprotect(guard, 4096, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 1; }
    return check("all, the guard opened again", p, 64 * MB, 18);
}

static int c_reserve_commit(void) {
    /* As mimalloc, Go and the JVM do: reserve inaccessible, open parts as needed. */
    char *p = map(256 * MB, PROT_NONE);
    if (!faults(p, 0)) { printf("a reservation is readable\n"); return 1; }
    for (int k = 0; k < 4; k++) {
        if (mprotect(p + k * 32 * MB, 16 * MB, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 1; }
        fill(p + k * 32 * MB, 16 * MB, 30 + k);
    }
    for (int k = 0; k < 4; k++) CHECK(check("committed part", p + k * 32 * MB, 16 * MB, 30 + k));
    if (!faults(p + 16 * MB, 0)) { printf("an uncommitted part is readable\n"); return 1; }
    /* Decommit one the other way programs do it: MAP_FIXED of a fresh inaccessible mapping. */
    if (mmap(p, 16 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != p) {
        perror("mmap fixed"); return 1;
    }
    if (!faults(p, 0)) { printf("a decommitted part is readable\n"); return 1; }
    if (mprotect(p, 16 * MB, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 1; }
    CHECK(check("recommitted part", p, 16 * MB, 0));
    for (int k = 1; k < 4; k++) CHECK(check("other parts", p + k * 32 * MB, 16 * MB, 30 + k));
    return munmap(p, 256 * MB);
}

static int c_munmap_partial(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 40);
    if (munmap(p + 16 * MB, 16 * MB)) { perror("munmap"); return 1; }
    CHECK(check("before the hole", p, 16 * MB, 40));
    uint64_t *rest = (uint64_t *)(p + 32 * MB);
    for (size_t i = 0; i < 32 * MB / 8; i++)
        if (rest[i] != word(40, i + 32 * MB / 8)) { printf("after the hole: word %zu\n", i); return 1; }
    char *q = map(16 * MB, PROT_READ | PROT_WRITE);
    CHECK(check("a new mapping", q, 16 * MB, 0));
    /* Unmapping a range twice, or one never mapped, is not an error. */
    if (munmap(p + 16 * MB, 16 * MB)) { perror("munmap again"); return 1; }
    return check("before the hole, still", p, 16 * MB, 40);
}

static int c_map_fixed(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 41);
    char *mid = p + 16 * MB;
    if (mmap(mid, 16 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != mid) {
        perror("mmap fixed"); return 1;
    }
    CHECK(check("fixed anonymous mapping", mid, 16 * MB, 0));
    CHECK(check("before it", p, 16 * MB, 41));
    void *clash = mmap(mid, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("MAP_FIXED_NOREPLACE over a mapping: %s\n", clash == MAP_FAILED ? strerror(errno) : "mapped");
    /* A file over part of it. */
    char path[] = "/tmp/tidepool-memcalls-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 2; }
    unlink(path);
    char *buf = malloc(8 * MB);
    fill(buf, 8 * MB, 42);
    if (write(fd, buf, 8 * MB) != (ssize_t)(8 * MB)) { perror("write"); return 2; }
    char *f = mmap(mid, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (f != mid) { perror("mmap file fixed"); return 1; }
    char *other = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(other, 64 * MB, 43);
    CHECK(check("file mapped over the middle", f, 8 * MB, 42));
    CHECK(check("anonymous after the file", mid + 8 * MB, 8 * MB, 0));
    fill(f, 4 * MB, 44); /* private copy-on-write of the file */
    CHECK(check("written file pages", f, 4 * MB, 44));
    if (munmap(f, 8 * MB)) { perror("munmap file"); return 1; }
    if (mmap(f, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != f) {
        perror("mmap fixed after the file"); return 1;
    }
    CHECK(check("anonymous again where the file was", f, 8 * MB, 0));
    fill(p, 64 * MB, 45);
    CHECK(check("all rewritten", p, 64 * MB, 45));
    close(fd);
    return check("the other mapping", other, 64 * MB, 43);
}

static int c_brk(void) {
    char *start = sbrk(0);
    if (sbrk(64 * MB) != start) { perror("sbrk"); return 1; }
    fill(start, 64 * MB, 50);
    CHECK(check("grown break", start, 64 * MB, 50));
    if (sbrk(-(intptr_t)(32 * MB)) == (void *)-1) { perror("sbrk down"); return 1; }
    if ((char *)sbrk(0) != start + 32 * MB) { printf("the break is not where it was put\n"); return 1; }
    if (sbrk(32 * MB) == (void *)-1) { perror("sbrk up again"); return 1; }
    CHECK(check("kept part", start, 32 * MB, 50));
    CHECK(check("given back and grown again", start + 32 * MB, 32 * MB, 0));
    if (brk(start)) { perror("brk"); return 1; }
    return (char *)sbrk(0) != start;
}

/* An allocator with arenas of its own, loaded with dlopen, its own entry points used. */
static int allocator(const char *lib, const char *alloc_name, const char *free_name, int flags_arg) {
    /* Already loaded (jemalloc cannot be dlopen'ed: its TLS is initial-exec; run the case
     * with LD_PRELOAD=libjemalloc.so.2), or loaded now. */
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("%s: not loaded\n", lib); return 0; }
    void *(*alloc)() = (void *(*)())dlsym(h, alloc_name);
    void (*release)() = (void (*)())dlsym(h, free_name);
    if (!alloc || !release) { printf("%s lacks %s or %s\n", lib, alloc_name, free_name); return 1; }
    enum { N = 1024 };
    size_t block = 64 * MB / N;
    char **b = calloc(N, sizeof *b);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            if (b[i]) continue;
            b[i] = flags_arg ? alloc(block, 0) : alloc(block);
            if (!b[i]) { printf("%s: %s failed\n", lib, alloc_name); return 1; }
            fill(b[i], block, 60 + i + round * N);
        }
        for (int i = 0; i < N; i++) {
            uint64_t seed = 0;
            for (int r = round; r >= 0; r--) {
                /* The block was filled in the round it was last allocated. */
                const uint64_t *m = (const uint64_t *)b[i];
                if (m[0] == word(60 + i + r * N, 0)) { seed = 60 + i + r * N; break; }
            }
            if (!seed || check(lib, b[i], block, seed)) { printf("%s: block %d\n", lib, i); return 1; }
        }
        for (int i = round % 2; i < N; i += 2) {
            if (flags_arg) release(b[i], 0); else release(b[i]);
            b[i] = NULL;
        }
    }
    printf("%s: %s/%s fine\n", lib, alloc_name, free_name);
    return 0;
}

static int c_allocators(void) {
    CHECK(allocator("libjemalloc.so.2", "mallocx", "dallocx", 1));
    CHECK(allocator("libtcmalloc_minimal.so.4", "tc_malloc", "tc_free", 0));
    return allocator("libmimalloc.so.2", "mi_malloc", "mi_free", 0);
}

static int c_mlock(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 70);
    int r = mlock(p, 16 * MB) | munlock(p, 16 * MB);
    CHECK(check("after mlock", p, 64 * MB, 70));
    return r != 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

/* madvise(MADV_POPULATE_READ/WRITE) faults a whole range in from inside one system call (the
 * kernel's get_user_pages, as mlock and O_DIRECT do): back to back over four times the budget,
 * the thread waits in page faults for a long time without completing one of its own. Kernels
 * before 5.14 refuse the advice (EINVAL), natively and paged alike. */
static int c_madvise_populate(void) {
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 80);
    for (int i = 0; i < 32; i++) {
        int advice = i % 2 ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
        if (madvise(p, 64 * MB, advice) != 0 && errno != EINVAL) { perror("madvise"); return 1; }
    }
    CHECK(check("after populating", p, 64 * MB, 80));
    return 0;
}

/* Protection changing while the pager evicts: a thread walks a mapping a 64 KiB chunk at a
 * time, bringing each in and turning protection off and on again, many times, on the chunk it
 * brought in a budget's worth of chunks earlier (the one the pager is about to evict), while
 * the main thread fills a second mapping, which forces evictions. An eviction that read a page
 * made inaccessible meanwhile would kill the process. */
static char *storm_area;
static int storm_done; /* read and written with __atomic builtins */

static void *storm(void *arg) {
    (void)arg;
    const size_t chunk = 65536, chunks = 64 * MB / chunk, behind = chunks / 4;
    for (int lap = 0; lap < 3; lap++)
        for (size_t k = 0; k < chunks; k++) {
            volatile char *c = storm_area + k * chunk;
            for (size_t i = 0; i < chunk; i += 4096) (void)c[i];
            char *old = storm_area + ((k + chunks - behind) % chunks) * chunk;
            for (int i = 0; i < 8; i++) {
                if (mprotect(old, chunk, PROT_NONE)) { perror("mprotect"); exit(1); }
                sched_yield();
                if (mprotect(old, chunk, PROT_READ | PROT_WRITE)) { perror("mprotect"); exit(1); }
            }
        }
    __atomic_store_n(&storm_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int c_mprotect_storm(void) {
    storm_area = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(storm_area, 64 * MB, 90);
    char *other = map(64 * MB, PROT_READ | PROT_WRITE);
    pthread_t t;
    if (pthread_create(&t, NULL, storm, NULL)) { printf("pthread_create failed\n"); return 1; }
    uint64_t seed = 91;
    while (!__atomic_load_n(&storm_done, __ATOMIC_ACQUIRE)) fill(other, 64 * MB, ++seed);
    pthread_join(t, NULL);
    CHECK(check("the other mapping", other, 64 * MB, seed));
    return check("the stormed mapping", storm_area, 64 * MB, 90);
}

/* Protection keys: pages tagged with a key the pager's threads were never given, and pages
 * closed with pkey_mprotect, which glibc calls without going through mprotect. */
static int c_pkey_protect(void) {
    int open_key = pkey_alloc(0, 0), closed_key = pkey_alloc(0, 0);
    if (open_key < 0 || closed_key < 0) { printf("no protection keys here\n"); return 0; }
    char *p = map(64 * MB, PROT_READ | PROT_WRITE);
    fill(p, 64 * MB, 40);
    if (pkey_mprotect(p, 16 * MB, PROT_READ | PROT_WRITE, open_key)) { perror("pkey_mprotect"); return 1; }
    char *closed = p + 32 * MB;
    if (pkey_mprotect(closed, 16 * MB, PROT_NONE, closed_key)) { perror("pkey_mprotect"); return 1; }
    if (!faults(closed, 0)) { printf("a page closed with pkey_mprotect did not fault\n"); return 1; }
    /* The kernel runs a signal handler with the default key rights, and siglongjmp skips the
     * sigreturn that would restore ours. */
    if (pkey_set(open_key, 0) || pkey_set(closed_key, 0)) { perror("pkey_set"); return 1; }
    /* Much more than fits: the keyed pages go far and come back, the closed ones stay. */
    char *other = map(64 * MB, PROT_READ | PROT_WRITE);
    for (int round = 0; round < 2; round++) {
        fill(other, 64 * MB, 41 + round);
        CHECK(check("keyed, pushed out and back", p, 16 * MB, 40));
    }
    if (pkey_mprotect(closed, 16 * MB, PROT_READ | PROT_WRITE, closed_key)) { perror("pkey_mprotect"); return 1; }
    CHECK(check("all, the closed part opened again", p, 64 * MB, 40));
    pkey_free(open_key);
    pkey_free(closed_key);
    return check("the other mapping", other, 64 * MB, 42);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: memcalls CASE MIB\n"); return 2; }
    /* The cases speak in units of MIB/64 MiB: "64 * MB" is MIB MiB. */
    MB = (size_t)atol(argv[2]) << 20 >> 6;
    MB = MB / 4096 * 4096;
    struct { const char *name; int (*f)(void); } cases[] = {
        {"mremap-grow", c_mremap_grow}, {"mremap-shrink", c_mremap_shrink},
        {"mremap-fixed", c_mremap_fixed}, {"mremap-dontunmap", c_mremap_dontunmap},
        {"madvise-dontneed", c_madvise_dontneed}, {"madvise-free", c_madvise_free},
        {"madvise-remove", c_madvise_remove}, {"hugepages", c_hugepages},
        {"mprotect-readonly", c_mprotect_readonly}, {"mprotect-guard", c_mprotect_guard},
        {"reserve-commit", c_reserve_commit}, {"munmap-partial", c_munmap_partial},
        {"map-fixed", c_map_fixed}, {"brk", c_brk}, {"allocators", c_allocators},
        {"mlock", c_mlock}, {"madvise-populate", c_madvise_populate},
        {"mprotect-storm", c_mprotect_storm}, {"pkey-protect", c_pkey_protect},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(argv[1], cases[i].name) || !strcmp(argv[1], "all")) {
            int r = cases[i].f();
            if (r) { printf("FAILED %s\n", cases[i].name); return 1; }
            printf("ok %s\n", cases[i].name);
            fflush(stdout);
            if (strcmp(argv[1], "all")) return 0;
        }
    if (!strcmp(argv[1], "all")) return 0;
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
}
