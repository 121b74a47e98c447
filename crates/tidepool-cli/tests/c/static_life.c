/* A statically linked program's life under `tidepool run`: prints its arguments, an
 * environment variable, a thread's answer, what fork says, and whether the supervisor's
 * descriptor variable leaked into its environment; exits with status 3.
 *
 * usage: static_life ARGS...
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void *answer(void *arg) { (void)arg; return (void *)42L; }

int main(int argc, char **argv) {
    printf("argc %d", argc);
    for (int i = 1; i < argc; i++) printf("%s%s", i == 1 ? " " : "|", argv[i]);
    printf("\nenv %s\n", getenv("STATIC_LIFE") ? getenv("STATIC_LIFE") : "(none)");
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, answer, NULL);
    pthread_join(t, &r);
    printf("thread %ld\n", (long)r);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid < 0) printf("fork: %s\n", strerror(errno));
    else waitpid(pid, NULL, 0), printf("fork: ok\n");
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "TIDEPOOL_SUPERVISOR_FD", 22) == 0) printf("%s\n", *e);
    /* Sockets open: under the pager its control socket (`tidepool resize`), and no socket of
     * the supervisor's. */
    char path[64], target[256];
    int sockets = 0;
    for (int fd = 3; fd < 64; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strncmp(target, "socket:", 7) == 0) sockets++;
    }
    printf("sockets %d\n", sockets);
    return 3;
}
