/* Frees wrongly on purpose, as argv[1] says: "double" frees a block twice with other traffic
 * between, "interior" frees a pointer into the middle of a block, "ok" frees correctly. Under
 * TIDEPOOL_ALLOC_DEBUG=1 the first two must abort with the allocator's message. Every pointer
 * goes through a volatile slot, so the compiler can neither drop the allocations nor see the
 * mistakes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *volatile slot;

static char *opaque(char *p) {
    slot = p;
    return slot;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char *keep[1000];
    for (int i = 0; i < 1000; i++) {
        keep[i] = opaque(malloc(48));
        memset(keep[i], i, 48);
    }
    char *p = opaque(malloc(48));
    memset(p, 1, 48);
    if (strcmp(argv[1], "double") == 0) {
        slot = p;
        free(p);
        for (int i = 0; i < 1000; i++) free(keep[i]);
        free(slot);
    } else if (strcmp(argv[1], "interior") == 0) {
        free(opaque(keep[10] + 16));
    } else {
        free(p);
        for (int i = 0; i < 1000; i++) free(keep[i]);
    }
    puts("done");
    return 0;
}
