/* Start-to-exit time and peak RSS of one fresh process.
 *
 *   coldstart RESULT_FILE COMMAND [ARGS...]
 *
 * Forks, execs COMMAND (its stdout/stderr are this program's) and waits for it with
 * wait4; writes "<wall seconds> <peak RSS KiB> <exit code>" to RESULT_FILE. A small
 * launcher is needed because Linux keeps a process's peak RSS across exec: a child
 * forked straight from the (large) benchmark process would report the parent's size.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s RESULT_FILE COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    FILE *result = fopen(argv[1], "w");
    if (result == NULL) {
        perror(argv[1]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) < 0) {
        perror("wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    fprintf(result, "%.6f %ld %d\n", wall, usage.ru_maxrss, code);
    fclose(result);
    return code;
}
