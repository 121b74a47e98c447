/* A memoization cache in C over soft memory.
 *
 * count_primes(n) is slow; its results are kept in a soft map keyed by n. The map's
 * reconstruct callback computes a missing result, so a lookup always answers: from the cache
 * while soft memory holds it, recomputed after the memory was taken back for something else.
 * The example checks both cases and exits 0 when every answer is right. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tidepool.h"

static unsigned computed; /* how many times count_primes really ran */

/* The expensive function: primes below n, by trial division. */
static uint64_t count_primes(uint64_t n) {
    uint64_t count = 0;
    for (uint64_t i = 2; i < n; i++) {
        int prime = 1;
        for (uint64_t d = 2; d * d <= i; d++) {
            if (i % d == 0) {
                prime = 0;
                break;
            }
        }
        count += (uint64_t)prime;
    }
    computed++;
    return count;
}

/* The map's reconstruct callback: the key is a uint64_t n, the value count_primes(n). */
static int rebuild(void *user, const uint8_t *key, size_t key_len, tp_buf *out) {
    (void)user;
    uint64_t n, v;
    if (key_len != sizeof n)
        return 22; /* reported by the failing get as TP_ERECONSTRUCT, with this code */
    memcpy(&n, key, sizeof n);
    v = count_primes(n);
    return tp_buf_append(out, &v, sizeof v) == TP_OK ? 0 : 12;
}

/* primes below n, through the cache. */
static int lookup(tp_soft_map *memo, uint64_t n, uint64_t *result) {
    size_t len = 0;
    tp_status s = tp_soft_map_get(memo, &n, sizeof n, result, sizeof *result, &len);
    if (s != TP_OK) {
        fprintf(stderr, "memo: lookup of %llu failed (%d): %s\n", (unsigned long long)n, (int)s,
                tp_last_error());
        return -1;
    }
    return 0;
}

int main(void) {
    enum { N = 40 };
    uint64_t expected[N], got;
    tp_arena *arena = tp_arena_new(64 << 20, 0);
    tp_soft_map *memo;
    tp_stats stats;
    int bad = 0;

    if (arena == NULL) {
        fprintf(stderr, "memo: %s\n", tp_last_error());
        return 1;
    }
    memo = tp_soft_map_new(arena, rebuild, NULL);
    if (memo == NULL) {
        fprintf(stderr, "memo: %s\n", tp_last_error());
        return 1;
    }
    for (int i = 0; i < N; i++) {
        expected[i] = count_primes(1000 + 500 * (uint64_t)i);
    }
    computed = 0;

    /* First pass computes, second pass hits. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            if (lookup(memo, 1000 + 500 * (uint64_t)i, &got) != 0)
                return 1;
            bad += got != expected[i];
        }
    }
    printf("memo: 2 passes of %d lookups: %u computed\n", N, computed);
    bad += computed != N;

    /* Memory pressure takes all of soft memory back: lookups still answer, recomputing. */
    tp_arena_set_budget(arena, 0);
    tp_arena_set_budget(arena, 64 << 20);
    for (int i = 0; i < N; i++) {
        if (lookup(memo, 1000 + 500 * (uint64_t)i, &got) != 0)
            return 1;
        bad += got != expected[i];
    }
    printf("memo: after soft memory was taken back: %u computed in all\n", computed);
    bad += computed != 2 * N;

    tp_soft_map_stats(memo, &stats);
    printf("memo: %llu hits, %llu misses, %llu reconstructions (%.1f us each)\n",
           (unsigned long long)stats.hits, (unsigned long long)stats.misses,
           (unsigned long long)stats.reconstructions, stats.reconstruct_us);
    bad += stats.hits != N;

    tp_soft_map_free(memo);
    tp_arena_free(arena);
    if (bad) {
        fprintf(stderr, "memo: %d checks failed\n", bad);
        return 1;
    }
    printf("memo: ok\n");
    return 0;
}
