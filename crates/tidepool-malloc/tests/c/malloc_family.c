/* The malloc family through its real C symbols, run under LD_PRELOAD=libtidepool_malloc.so.
 * Prints one line per check; exits non-zero on the first failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void free_sized(void *, size_t) __attribute__((weak));
extern void free_aligned_sized(void *, size_t, size_t) __attribute__((weak));

#define CHECK(cond, what)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            printf("FAIL %s (line %d, errno %d)\n", what, __LINE__, errno);              \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static void *producer_blocks[10000];

static void *consumer(void *arg) {
    (void)arg;
    for (int i = 0; i < 10000; i++) {
        CHECK(((unsigned char *)producer_blocks[i])[0] == (unsigned char)i, "cross-thread contents");
        free(producer_blocks[i]);
    }
    return NULL;
}

static void *short_lived(void *arg) {
    void **keep = arg;
    for (int i = 0; i < 1000; i++) free(malloc(i));
    *keep = malloc(300);
    return NULL;
}

int main(void) {
    Dl_info info;
    CHECK(dladdr((void *)malloc, &info) && strstr(info.dli_fname, "tidepool_malloc"), "malloc resolves to libtidepool_malloc");
    printf("malloc from %s\n", info.dli_fname);

    void *a = malloc(0), *b = malloc(0);
    CHECK(a && b && a != b, "malloc(0) distinct");
    free(a);
    free(b);
    free(NULL);
    CHECK(malloc_usable_size(NULL) == 0, "usable size of NULL");

    for (size_t align = sizeof(void *); align <= 65536; align *= 2) {
        void *p = NULL;
        CHECK(posix_memalign(&p, align, 100) == 0 && ((uintptr_t)p % align) == 0, "posix_memalign");
        void *q = aligned_alloc(align, align * 3);
        CHECK(q && ((uintptr_t)q % align) == 0, "aligned_alloc");
        void *m = memalign(align, 1);
        CHECK(m && ((uintptr_t)m % align) == 0, "memalign");
        memset(p, 1, 100);
        memset(q, 2, align * 3);
        free(p);
        free(q);
        free(m);
    }
    void *p = NULL;
    CHECK(posix_memalign(&p, 3, 10) == EINVAL, "posix_memalign rejects 3");
    void *v = valloc(1), *pv = pvalloc(1);
    CHECK(((uintptr_t)v % 4096) == 0 && ((uintptr_t)pv % 4096) == 0, "valloc/pvalloc page aligned");
    CHECK(malloc_usable_size(pv) >= 4096, "pvalloc whole page");
    free(v);
    free(pv);

    volatile size_t huge = SIZE_MAX / 2;
    errno = 0;
    CHECK(calloc(huge, 3) == NULL && errno == ENOMEM, "calloc overflow");
    errno = 0;
    void *r = malloc(10);
    CHECK(reallocarray(r, huge, 3) == NULL && errno == ENOMEM, "reallocarray overflow");
    r = reallocarray(r, 10, 10);
    CHECK(r && malloc_usable_size(r) >= 100, "reallocarray");
    char *s = realloc(r, 1 << 20);
    CHECK(s, "realloc grow");
    memset(s, 'x', 1 << 20);
    s = realloc(s, 10);
    CHECK(s && s[9] == 'x', "realloc shrink keeps prefix");
    CHECK(realloc(s, 0) == NULL, "realloc(p, 0) frees");
    printf("api edges ok\n");

    void *la = __libc_malloc(50), *lc = __libc_calloc(5, 10), *lm = __libc_memalign(64, 10);
    CHECK(la && lc && lm && ((uintptr_t)lm % 64) == 0, "__libc_* aliases");
    la = __libc_realloc(la, 5000);
    __libc_free(la);
    __libc_free(lc);
    __libc_free(lm);
    if (free_sized) {
        free_sized(malloc(77), 77);
        free_aligned_sized(aligned_alloc(256, 512), 256, 512);
    }
    printf("aliases ok\n");

    for (int i = 0; i < 10000; i++) {
        producer_blocks[i] = malloc(16 + i % 200);
        ((unsigned char *)producer_blocks[i])[0] = (unsigned char)i;
    }
    pthread_t t;
    pthread_create(&t, NULL, consumer, NULL);
    pthread_join(t, NULL);
    for (int i = 0; i < 100; i++) {
        void *kept = NULL;
        pthread_create(&t, NULL, short_lived, &kept);
        pthread_join(t, NULL);
        free(kept);
    }
    printf("threads ok\n");

    char *before = strdup("survives fork");
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 100000; i++) free(malloc(i % 5000));
        int ok = strcmp(before, "survives fork") == 0;
        free(before);
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork child");
    free(before);
    printf("fork ok\n");
    return 0;
}
