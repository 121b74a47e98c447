// A single-threaded program that hops between CPUs: pinned to CPU (hop % cpus), it touches a
// few pages far apart, then hops. Under `tidepool run` every hop's first fault comes from
// another CPU than the last: a pager following the program moves its reader at once.
// Usage: hops MIB HOPS PAGES_PER_HOP CPUS; prints the sum of the bytes it wrote and read.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: hops MIB HOPS PAGES_PER_HOP CPUS\n");
        return 2;
    }
    size_t pages = (size_t)atoi(argv[1]) << 8;
    int hops = atoi(argv[2]), per_hop = atoi(argv[3]), cpus = atoi(argv[4]);
    unsigned char *m = mmap(NULL, pages << 12, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    // First touch of every page, so that later touches fetch pages evicted since.
    for (size_t p = 0; p < pages; p++)
        m[p << 12] = (unsigned char)(p * 7);
    unsigned long sum = 0;
    for (int h = 0; h < hops; h++) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(h % cpus, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            perror("sched_setaffinity");
            return 1;
        }
        for (int i = 0; i < per_hop; i++) {
            // Far apart and out of order: no stride a prefetcher would follow.
            size_t p = ((size_t)(h * per_hop + i) * 2654435761u) % pages;
            sum += m[p << 12];
            m[(p << 12) + 1] = 1;
        }
    }
    printf("%lu\n", sum);
    return 0;
}
