/* Fork without exec under `tidepool run`: every case fills memory larger than the local budget
 * with a pattern, forks, and has parent and child check every word of what they should see
 * and change their own copies independently. Prints "ok CASE" and exits 0, or names the first
 * wrong word and exits 1. Run natively it must say the same.
 *
 * usage: forks CASE MIB
 *   basic       one child; both verify, both write, neither sees the other's writes
 *   threads     the parent forks while four threads rewrite their own pages
 *   grandchild  a child forks again; three generations each verify their own version
 *   orphan      the parent exits at once; the child verifies after its parent is gone
 *   exec        fork+exec, posix_spawn and vfork+exec, with exit statuses passed back
 *   shared      MAP_SHARED anonymous memory stays shared between parent and child
 *   advice      MADV_WIPEONFORK reads as zeros in the child, MADV_DONTFORK is absent there
 *   scan        the child reads all of its parent's memory twice, as Redis's BGSAVE does, and
 *               writes to stderr the memory it holds of its own ("child private KiB N": pages
 *               not shared with its parent)
 *   storm       the parent forks twenty times while four threads fault all over memory, a
 *               fifth opens and closes streams and looks up users (faulting with glibc's
 *               locks held), a timer's signal runs on an alternate stack in the heap, and stdio
 *               streams the program opened wait in memory: each child checks every word,
 *               writes its own, uses the streams and forks a grandchild that checks them
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Leaves a child at once (no atexit handlers, no parent's buffers twice), saying first what it
 * printed: a failure's line must reach the test. */
static void leave(int code) {
    fflush(stdout);
    _exit(code);
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t word(uint64_t seed, size_t i) { return mix(seed * 0x9E3779B97F4A7C15ULL + i); }

static void fill(uint64_t *m, size_t n, uint64_t seed, size_t from, size_t step) {
    for (size_t i = from; i < n; i += step) m[i] = word(seed, i);
}

/* Checks words [from, n) in steps; returns 0 or prints the first wrong one. */
static int check(const char *who, const uint64_t *m, size_t n, uint64_t seed, size_t from,
                 size_t step) {
    for (size_t i = from; i < n; i += step)
        if (m[i] != word(seed, i)) {
            printf("%s: word %zu is %016llx, expected %016llx (seed %llu)\n", who, i,
                   (unsigned long long)m[i], (unsigned long long)word(seed, i),
                   (unsigned long long)seed);
            return 1;
        }
    return 0;
}

static int status_of(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

static uint64_t *alloc_words(size_t n) {
    uint64_t *m = malloc(n * 8);
    if (!m) { perror("malloc"); exit(2); }
    return m;
}

static int basic(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 1, 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        if (check("child before writing", m, n, 1, 0, 1)) leave(1);
        fill(m, n, 2, 0, 2); /* even words: the child's own */
        if (check("child, its words", m, n, 2, 0, 2) || check("child, the rest", m, n, 1, 1, 2))
            leave(1);
        leave(0);
    }
    fill(m, n, 3, 1, 2); /* odd words: the parent's own, meanwhile */
    int st = status_of(pid);
    if (st != 0) { printf("child exited %d\n", st); return 1; }
    if (check("parent, its words", m, n, 3, 1, 2) || check("parent, the rest", m, n, 1, 0, 2))
        return 1;
    return 0;
}

/* Private_Clean + Private_Dirty of this process, in KiB: what it holds that no other process
 * maps. */
static long private_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long sum = 0, v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Private_Clean: %ld", &v) == 1 || sscanf(line, "Private_Dirty: %ld", &v) == 1)
            sum += v;
    fclose(f);
    return sum;
}

static int scan(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 5, 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        if (check("child, first pass", m, n, 5, 0, 1) || check("child, second pass", m, n, 5, 0, 1))
            leave(1);
        fprintf(stderr, "child private KiB %ld\n", private_kib());
        leave(0);
    }
    int st = status_of(pid);
    if (st != 0) { printf("child exited %d\n", st); return 1; }
    return check("parent after the child", m, n, 5, 0, 1);
}

/* threads: each thread owns a slice of pages and rewrites it, word by word, round after round;
 * word i of round r is word(r, i). At the fork a thread may be half way through a page, so
 * each word of the child's copy must be of round r or r+1 where r is the slice's round. */
struct slice { uint64_t *m; size_t from, to; volatile uint64_t round; volatile int stop; };

static void *rewrite(void *arg) {
    struct slice *s = arg;
    while (!s->stop) {
        uint64_t r = s->round + 1;
        for (size_t i = s->from; i < s->to; i++) s->m[i] = word(100 + r, i);
        __atomic_store_n(&s->round, r, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int threads(size_t n) {
    uint64_t *m = alloc_words(n);
    struct slice s[4];
    pthread_t t[4];
    for (int k = 0; k < 4; k++) {
        s[k] = (struct slice){m, n / 4 * k, n / 4 * (k + 1), 0, 0};
        for (size_t i = s[k].from; i < s[k].to; i++) m[i] = word(100, i);
        pthread_create(&t[k], NULL, rewrite, &s[k]);
    }
    usleep(200000);
    pid_t pid = fork();
    if (pid == 0) {
        for (int k = 0; k < 4; k++) {
            uint64_t r = s[k].round;
            for (size_t i = s[k].from; i < s[k].to; i++)
                if (m[i] != word(100 + r, i) && m[i] != word(100 + r + 1, i)) {
                    printf("child: slice %d word %zu matches neither round %llu nor the next\n", k,
                           i, (unsigned long long)r);
                    leave(1);
                }
        }
        /* Threads do not survive fork; the child can still use its memory and make threads. */
        fill(m, n, 7, 0, 1);
        leave(check("child after rewriting", m, n, 7, 0, 1));
    }
    int st = status_of(pid);
    for (int k = 0; k < 4; k++) s[k].stop = 1;
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
    if (st != 0) { printf("child exited %d\n", st); return 1; }
    for (int k = 0; k < 4; k++)
        if (check("parent", m, s[k].to, 100 + s[k].round, s[k].from, 1)) return 1;
    return 0;
}

static int grandchild(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 1, 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        fill(m, n, 2, 0, 3);
        pid_t g = fork();
        if (g == 0) {
            if (check("grandchild, child's words", m, n, 2, 0, 3) ||
                check("grandchild, original words", m, n, 1, 1, 3))
                leave(1);
            fill(m, n, 4, 1, 3);
            leave(check("grandchild, own words", m, n, 4, 1, 3) ||
                  check("grandchild, child's words again", m, n, 2, 0, 3));
        }
        fill(m, n, 3, 2, 3);
        int st = status_of(g);
        if (st != 0) { printf("grandchild exited %d\n", st); leave(1); }
        leave(check("child, own words", m, n, 2, 0, 3) || check("child, later words", m, n, 3, 2, 3) ||
              check("child, original words", m, n, 1, 1, 3));
    }
    fill(m, n, 5, 1, 3);
    int st = status_of(pid);
    if (st != 0) { printf("child exited %d\n", st); return 1; }
    return check("parent, original words", m, n, 1, 0, 3) || check("parent, own words", m, n, 5, 1, 3) ||
           check("parent, original words", m, n, 1, 2, 3);
}

static int orphan(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 9, 0, 1);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Wait until the parent has exited (we are re-parented). */
        while (getppid() == parent) usleep(10000);
        if (check("orphan", m, n, 9, 0, 1)) leave(1);
        fill(m, n, 10, 0, 1);
        if (check("orphan after writing", m, n, 10, 0, 1)) leave(1);
        printf("ok orphan child\n");
        fflush(stdout);
        leave(0);
    }
    /* The parent goes first, leaving its memory to the child alone. */
    fill(m, n, 11, 0, 1);
    return 0;
}

static int exec_cases(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 1, 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", "exit 7", (char *)NULL);
        leave(100);
    }
    if (status_of(pid) != 7) { printf("fork+exec: wrong status\n"); return 1; }
    char *argv[] = {"sh", "-c", "exit 8", NULL};
    if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0) { printf("posix_spawn failed\n"); return 1; }
    if (status_of(pid) != 8) { printf("posix_spawn: wrong status\n"); return 1; }
    pid = vfork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", "exit 9", (char *)NULL);
        leave(100);
    }
    if (status_of(pid) != 9) { printf("vfork+exec: wrong status\n"); return 1; }
    return check("parent after the children", m, n, 1, 0, 1);
}

static int shared(size_t n) {
    uint64_t *m = alloc_words(n);
    fill(m, n, 1, 0, 1);
    size_t sn = 1 << 20; /* 8 MiB shared */
    uint64_t *sh = mmap(NULL, sn * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) { perror("mmap"); return 2; }
    fill(sh, sn, 20, 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        if (check("child, shared", sh, sn, 20, 0, 1) || check("child, private", m, n, 1, 0, 1)) leave(1);
        fill(sh, sn, 21, 0, 1);
        fill(m, n, 22, 0, 1);
        leave(0);
    }
    if (status_of(pid) != 0) { printf("child failed\n"); return 1; }
    return check("parent, shared (the child's writes)", sh, sn, 21, 0, 1) ||
           check("parent, private (its own)", m, n, 1, 0, 1);
}

/* storm: word i always holds (i + 1) << 24 | version, whoever wrote it last and whenever the
 * fork came: a word read as zeros, or from another place, shows. */
static uint64_t storm_word(size_t i, uint64_t version) { return (uint64_t)(i + 1) << 24 | (version & 0xffffff); }
static int storm_place_ok(uint64_t w, size_t i) { return w >> 24 == (uint64_t)(i + 1); }

struct storm_slice { uint64_t *m; size_t from, to; uint64_t seed; volatile int stop; };

/* The threads fault only around each fork (the rest of the time they wait), so that the run's
 * length is the forks' and the children's, not theirs. */
static volatile int storming;

static void *storm_thread(void *arg) {
    struct storm_slice *s = arg;
    uint64_t x = s->seed, v = 1;
    size_t pages = (s->to - s->from) / 512;
    while (!s->stop) {
        if (!storming) {
            usleep(1000);
            continue;
        }
        /* A random page of the slice: read it all, rewrite it all (a fault, most times). */
        x = mix(x + 1);
        size_t first = s->from + (x % pages) * 512;
        for (size_t i = first; i < first + 512; i++) {
            if (!storm_place_ok(s->m[i], i)) {
                printf("parent thread: word %zu is %016llx\n", i, (unsigned long long)s->m[i]);
                fflush(stdout);
                leave(1);
            }
            s->m[i] = storm_word(i, v);
        }
        v++;
    }
    return NULL;
}

/* Opens, writes and closes streams and looks up a user, round after round: glibc holds its
 * stream list's lock while it walks the streams (fclose) and the NSS lock while it reads its
 * state, and both live in the heap, so this thread faults holding locks the fork takes. */
static FILE *volatile open_streams[64];
static volatile int stdio_stop;

static void *stdio_thread(void *arg) {
    (void)arg;
    uint64_t x = 99;
    while (!stdio_stop) {
        if (!storming) {
            usleep(1000);
            continue;
        }
        x = mix(x + 1);
        int k = (int)(x % 64);
        if (open_streams[k]) fclose(open_streams[k]);
        open_streams[k] = fopen("/dev/null", "w");
        if (!open_streams[k] || fprintf(open_streams[k], "%llu\n", (unsigned long long)x) < 0) {
            printf("stdio thread: a stream fails\n");
            fflush(stdout);
            leave(1);
        }
        if (!getpwuid(getuid())) {
            printf("stdio thread: getpwuid fails\n");
            fflush(stdout);
            leave(1);
        }
    }
    return NULL;
}

static volatile uint64_t *ticks; /* in the heap: the handler's write may fault */
static void on_tick(int sig) { (void)sig; (*ticks)++; }

static int storm(size_t n) {
    uint64_t *m = alloc_words(n);
    for (size_t i = 0; i < n; i++) m[i] = storm_word(i, 0);
    ticks = calloc(1, 4096);
    /* The alternate signal stack lives in the heap too, as stress-ng's does. */
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0};
    if (!ss.ss_sp || sigaltstack(&ss, NULL)) { perror("sigaltstack"); return 2; }
    struct sigaction sa = {.sa_handler = on_tick, .sa_flags = SA_ONSTACK | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval tick = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &tick, NULL);
    /* Streams opened early, so that the threads' faults evict them before the forks. */
    FILE *streams[32];
    for (int k = 0; k < 32; k++) {
        streams[k] = fopen("/dev/null", "w");
        if (!streams[k]) { perror("fopen"); return 2; }
        setvbuf(streams[k], NULL, _IOFBF, 8192);
    }
    struct storm_slice sl[4];
    pthread_t t[4], io;
    for (int k = 0; k < 4; k++) {
        sl[k] = (struct storm_slice){m, n / 4 * k, n / 4 * (k + 1), (uint64_t)k + 1, 0};
        pthread_create(&t[k], NULL, storm_thread, &sl[k]);
    }
    pthread_create(&io, NULL, stdio_thread, NULL);
    for (int round = 0; round < 20; round++) {
        /* A sweep over all the words first, which under a small budget evicts everything else
         * (the streams, glibc's NSS state): the fork then finds them far. */
        for (size_t i = 0; i < n; i += 512)
            if (!storm_place_ok(m[i], i)) {
                printf("parent sweep: word %zu is %016llx\n", i, (unsigned long long)m[i]);
                return 1;
            }
        storming = 1;
        usleep(20000);
        pid_t pid = fork();
        storming = 0;
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) {
            struct itimerval off = {{0, 0}, {0, 0}};
            setitimer(ITIMER_REAL, &off, NULL);
            for (size_t i = 0; i < n; i++)
                if (!storm_place_ok(m[i], i)) {
                    printf("child %d: word %zu is %016llx\n", round, i, (unsigned long long)m[i]);
                    leave(1);
                }
            for (int k = 0; k < 32; k++)
                if (fprintf(streams[k], "child %d\n", round) < 0 || fflush(streams[k])) {
                    printf("child %d: stream %d fails\n", round, k);
                    leave(1);
                }
            uint64_t mine = 0x800000 + (uint64_t)round;
            for (size_t i = 0; i < n; i++) m[i] = storm_word(i, mine);
            pid_t g = fork();
            if (g == 0) {
                for (size_t i = 0; i < n; i++)
                    if (m[i] != storm_word(i, mine)) {
                        printf("grandchild %d: word %zu is %016llx\n", round, i, (unsigned long long)m[i]);
                        leave(1);
                    }
                leave(0);
            }
            int st = status_of(g);
            if (st != 0) { printf("grandchild %d exited %d\n", round, st); leave(1); }
            leave(0);
        }
        int st = status_of(pid);
        if (st != 0) { printf("child %d exited %d\n", round, st); return 1; }
    }
    for (int k = 0; k < 4; k++) sl[k].stop = 1;
    stdio_stop = 1;
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
    pthread_join(io, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (size_t i = 0; i < n; i++)
        if (!storm_place_ok(m[i], i)) {
            printf("parent: word %zu is %016llx\n", i, (unsigned long long)m[i]);
            return 1;
        }
    for (int k = 0; k < 32; k++)
        if (fclose(streams[k])) { printf("parent: stream %d fails\n", k); return 1; }
    if (*ticks == 0) { printf("the timer never ran\n"); return 1; }
    return 0;
}

static sigjmp_buf jump;
static void on_segv(int sig) { (void)sig; siglongjmp(jump, 1); }

static int advice(size_t n) {
    size_t len = n * 8 / 4096 * 4096;
    uint64_t *wipe = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *gone = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (wipe == MAP_FAILED || gone == MAP_FAILED) { perror("mmap"); return 2; }
    size_t wn = len / 8;
    fill(wipe, wn, 30, 0, 1);
    fill(gone, (1 << 20) / 8, 31, 0, 1);
    if (madvise(wipe, len, MADV_WIPEONFORK) || madvise(gone, 1 << 20, MADV_DONTFORK)) {
        perror("madvise");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
        for (size_t i = 0; i < wn; i++)
            if (wipe[i] != 0) { printf("child: word %zu of a WIPEONFORK range is not zero\n", i); leave(1); }
        signal(SIGSEGV, on_segv);
        if (sigsetjmp(jump, 1) == 0) {
            volatile uint64_t v = gone[0];
            (void)v;
            printf("child: a DONTFORK range is readable\n");
            leave(1);
        }
        leave(0);
    }
    if (status_of(pid) != 0) { printf("child failed\n"); return 1; }
    return check("parent, WIPEONFORK range", wipe, wn, 30, 0, 1) ||
           check("parent, DONTFORK range", gone, (1 << 20) / 8, 31, 0, 1);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: forks CASE MIB\n"); return 2; }
    size_t n = (size_t)atol(argv[2]) << 17; /* words */
    int r;
    if (!strcmp(argv[1], "basic")) r = basic(n);
    else if (!strcmp(argv[1], "threads")) r = threads(n);
    else if (!strcmp(argv[1], "grandchild")) r = grandchild(n);
    else if (!strcmp(argv[1], "orphan")) r = orphan(n);
    else if (!strcmp(argv[1], "exec")) r = exec_cases(n);
    else if (!strcmp(argv[1], "shared")) r = shared(n);
    else if (!strcmp(argv[1], "advice")) r = advice(n);
    else if (!strcmp(argv[1], "storm")) r = storm(n);
    else if (!strcmp(argv[1], "scan")) r = scan(n);
    else { fprintf(stderr, "unknown case %s\n", argv[1]); return 2; }
    if (r == 0) printf("ok %s\n", argv[1]);
    fflush(stdout);
    return r;
}
