#include <stdio.h>
#include <string.h>
#include "tidepool.h"

static int fib_calls;
static int slow_fib(void *user, const uint8_t *key, size_t len, tp_buf *out) {
    (void)user;
    char s[32]; memcpy(s, key, len); s[len] = 0;
    unsigned long n = strtoul(s, 0, 10), a = 0, b = 1;
    for (unsigned long i = 0; i < n; i++) { unsigned long t = a + b; a = b; b = t; }
    fib_calls++;
    return tp_buf_append(out, &a, sizeof a);
}

int main(void) {
    tp_arena *arena = tp_arena_new(64 << 20, 0);
    if (!arena) { fprintf(stderr, "%s\n", tp_last_error()); return 1; }
    tp_soft_map *memo = tp_soft_map_new(arena, slow_fib, NULL);
    unsigned long v; size_t len;
    for (int round = 0; round < 2; round++)
        for (int n = 0; n < 50; n++) {
            char k[16]; int kl = snprintf(k, sizeof k, "%d", n);
            if (tp_soft_map_get(memo, k, kl, &v, sizeof v, &len) != TP_OK) { fprintf(stderr, "%s\n", tp_last_error()); return 1; }
        }
    tp_stats s; tp_soft_map_stats(memo, &s);
    printf("fib(49) = %lu; %d calls, %llu hits\n", v, fib_calls, (unsigned long long)s.hits);
    tp_soft_map_free(memo); tp_arena_free(arena);
    return fib_calls == 50 && v == 7778742049UL ? 0 : 1;
}
