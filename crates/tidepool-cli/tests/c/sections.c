/* Two call sites that map memory: an "arena" walked in order and a "table" touched at random.
 * Built with -rdynamic, so their names are dynamic symbols the preload can name sections by.
 * Prints a checksum that must match a native run. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#define LEN (16u << 20)

__attribute__((noinline)) void *grab_arena(void) {
    return mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

__attribute__((noinline)) void *grab_table(void) {
    return mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

int main(void) {
    unsigned char *arena = grab_arena(), *table = grab_table();
    if (arena == MAP_FAILED || table == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (uint32_t i = 0; i < LEN; i += 512) {
        arena[i] = (unsigned char)(i >> 9);
        table[i] = (unsigned char)(i >> 11);
    }
    uint64_t sum = 0, x = 88172645463325252ull;
    for (int round = 0; round < 3; round++) {
        for (uint32_t i = 0; i < LEN; i += 512)
            sum += arena[i];
        for (int k = 0; k < 4000; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            sum += table[(x % (LEN / 512)) * 512];
        }
    }
    printf("%llu\n", (unsigned long long)sum);
    return 0;
}
