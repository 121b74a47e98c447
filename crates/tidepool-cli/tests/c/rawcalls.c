/* Memory mapped with syscall(), not the libc wrappers: mmap, mremap, madvise, munmap and brk
 * each made as syscall(SYS_..., ...), over MIB MiB. Checks every word it should see, prints
 * what it checked and a checksum, and exits 0; names the first wrong word and exits 1. Run
 * natively it must say the same; under `tidepool run` its resident memory must stay near the
 * budget (the calls are paged as the wrappers' are).
 *
 * usage: rawcalls MIB
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33; return x;
}
static uint64_t word(uint64_t seed, size_t i) { return mix(seed * 0x9E3779B97F4A7C15ULL + i); }

static uint64_t sum;

static void fill(uint64_t *m, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) m[i] = word(seed, i);
}

/* Words [from, to) of m: the pattern `seed` wrote there, or zeros. */
static void check(const char *what, const uint64_t *m, size_t from, size_t to, uint64_t seed, int zeros) {
    for (size_t i = from; i < to; i++) {
        uint64_t want = zeros ? 0 : word(seed, i);
        if (m[i] != want) {
            printf("%s: word %zu is %016llx, not %016llx\n", what, i, (unsigned long long)m[i],
                   (unsigned long long)want);
            exit(1);
        }
        sum += m[i];
    }
    printf("ok %s\n", what);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: rawcalls MIB\n"); return 2; }
    size_t bytes = (size_t)atol(argv[1]) << 20, words = bytes / 8, mib = 1 << 20;
    long r = syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (r == -1) { perror("mmap"); return 1; }
    uint64_t *m = (uint64_t *)r;
    fill(m, words, 1);
    check("mmap", m, 0, words, 1, 0);

    /* Grow by half, moving if need be: the old words come along, the new ones read zero. */
    r = syscall(SYS_mremap, m, bytes, bytes + bytes / 2, MREMAP_MAYMOVE);
    if (r == -1) { perror("mremap"); return 1; }
    m = (uint64_t *)r;
    check("mremap keeps", m, 0, words, 1, 0);
    check("mremap grows with zeros", m, words, words + words / 2, 0, 1);

    /* Drop a quarter in the middle: zeros there, the rest untouched. */
    if (syscall(SYS_madvise, (char *)m + bytes / 4, bytes / 4, MADV_DONTNEED) != 0) {
        perror("madvise"); return 1;
    }
    check("madvise drops", m, words / 4, words / 2, 0, 1);
    check("madvise leaves the rest", m, words / 2, words, 1, 0);

    /* Give the tail back. */
    if (syscall(SYS_munmap, (char *)m + bytes, bytes / 2) != 0) { perror("munmap"); return 1; }

    /* The break: asked for, grown by a quarter of the size, filled, checked, given back. */
    uintptr_t b0 = (uintptr_t)syscall(SYS_brk, 0);
    uintptr_t want = b0 + bytes / 4;
    uintptr_t b1 = (uintptr_t)syscall(SYS_brk, want);
    if (b1 != want) { printf("brk moved to %#lx, not %#lx\n", (unsigned long)b1, (unsigned long)want); return 1; }
    fill((uint64_t *)b0, bytes / 32, 2);
    check("brk grows", (uint64_t *)b0, 0, bytes / 32, 2, 0);
    if ((uintptr_t)syscall(SYS_brk, b0) != b0) { printf("brk did not shrink\n"); return 1; }
    /* An impossible break leaves it where it was. */
    if ((uintptr_t)syscall(SYS_brk, (uintptr_t)1 << 62) != b0) { printf("brk moved too far\n"); return 1; }

    check("mmap at the end", m, 0, words / 4, 1, 0);
    if (syscall(SYS_munmap, m, bytes) != 0) { perror("munmap"); return 1; }
    printf("%zu MiB, sum %016llx\n", bytes / mib, (unsigned long long)sum);
    return 0;
}
