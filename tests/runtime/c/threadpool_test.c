/* Tests of cuvil_parallel_for, run by tests/runtime/test_threadpool.py.
 * Prints one line per failed check and "ok" at the end; exits 1 on any failure. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cuvil_runtime.h"

static int failures = 0;
#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            printf("FAIL line %d: ", __LINE__);   \
            printf(__VA_ARGS__);                  \
            printf("\n");                         \
            failures++;                           \
        }                                         \
    } while (0)

typedef struct {
    int64_t n;
    int *hits;
    int chunks, bad_range, sleep_ms, nested;
    int64_t first_begin, first_end;
    pthread_mutex_t lock;
    pthread_t seen[CUVIL_MAX_THREADS];
    int n_seen;
    int inner_calls, inner_serial; /* nested: calls of the inner loop, and how many ran as one chunk */
} job;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    job *outer;
    int chunks;
    int64_t begin, end;
} inner_job;

static void inner_body(void *ctx, int64_t b, int64_t e) {
    inner_job *in = (inner_job *)ctx;
    in->chunks++;
    in->begin = b;
    in->end = e;
}

static void body(void *ctx, int64_t b, int64_t e) {
    job *j = (job *)ctx;
    int64_t i;
    int k, known = 0;
    pthread_t self = pthread_self();
    if (b < 0 || e > j->n || b >= e) __atomic_store_n(&j->bad_range, 1, __ATOMIC_SEQ_CST);
    for (i = b; i < e && i < j->n && i >= 0; i++) __atomic_add_fetch(&j->hits[i], 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&j->lock);
    if (j->chunks++ == 0) {
        j->first_begin = b;
        j->first_end = e;
    }
    for (k = 0; k < j->n_seen; k++) known |= pthread_equal(j->seen[k], self);
    if (!known && j->n_seen < CUVIL_MAX_THREADS) j->seen[j->n_seen++] = self;
    pthread_mutex_unlock(&j->lock);
    if (j->nested) {
        inner_job in = {j, 0, -1, -1};
        cuvil_parallel_for(inner_body, &in, 64);
        pthread_mutex_lock(&j->lock);
        j->inner_calls++;
        j->inner_serial += in.chunks == 1 && in.begin == 0 && in.end == 64;
        pthread_mutex_unlock(&j->lock);
    }
    if (j->sleep_ms) sleep_ms(j->sleep_ms);
}

#if defined(__linux__) && defined(__GLIBC__)
/* Workers woken from sleep were steered off the caller's CPU: by the time they run a
 * chunk their affinity is the one they started with again. */
static cpu_set_t start_mask;
static int narrowed = 0;

static void mask_body(void *ctx, int64_t b, int64_t e) {
    cpu_set_t m;
    (void)ctx, (void)b, (void)e;
    if (pthread_getaffinity_np(pthread_self(), sizeof m, &m) != 0 || !CPU_EQUAL(&m, &start_mask))
        __atomic_store_n(&narrowed, 1, __ATOMIC_SEQ_CST);
    sleep_ms(20);
}
#endif

/* Run one loop of n on `threads` threads; check coverage and chunking. Returns the job's distinct threads. */
static int run_loop(int threads, int64_t n, int sleep, int nested) {
    job j;
    int64_t i;
    int once = 1;
    memset(&j, 0, sizeof j);
    pthread_mutex_init(&j.lock, NULL);
    j.n = n;
    j.sleep_ms = sleep;
    j.nested = nested;
    j.hits = (int *)calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    cuvil_set_num_threads(threads);
    cuvil_parallel_for(body, &j, n);
    for (i = 0; i < n; i++) once &= j.hits[i] == 1;
    CHECK(once, "threads=%d n=%lld: some index not covered exactly once", threads, (long long)n);
    CHECK(!j.bad_range, "threads=%d n=%lld: a chunk outside [0, n) or empty", threads, (long long)n);
    if (n <= 0) CHECK(j.chunks == 0, "n=%lld: fn called %d times", (long long)n, j.chunks);
    else CHECK(j.chunks >= 1 && j.chunks <= (threads < n ? threads : n), "threads=%d n=%lld: %d chunks", threads,
               (long long)n, j.chunks);
    if (threads == 1 && n > 0)
        CHECK(j.chunks == 1 && j.first_begin == 0 && j.first_end == n, "1 thread: not one call fn(ctx, 0, n)");
    if (nested) CHECK(j.inner_calls == j.chunks && j.inner_serial == j.inner_calls, "nested loops did not run serially"
                      " (%d of %d)", j.inner_serial, j.inner_calls);
    free(j.hits);
    pthread_mutex_destroy(&j.lock);
    return j.n_seen;
}

typedef struct {
    int threads, loops, ok, default_threads;
} caller;

static void *caller_main(void *arg) {
    caller *c = (caller *)arg;
    int l;
    c->default_threads = cuvil_get_num_threads();
    c->ok = 1;
    for (l = 0; l < c->loops; l++) {
        job j;
        int64_t i;
        memset(&j, 0, sizeof j);
        pthread_mutex_init(&j.lock, NULL);
        j.n = 997 + l;
        j.hits = (int *)calloc((size_t)j.n, sizeof(int));
        cuvil_set_num_threads(c->threads);
        cuvil_parallel_for(body, &j, j.n);
        for (i = 0; i < j.n; i++) c->ok &= j.hits[i] == 1;
        c->ok &= !j.bad_range && cuvil_get_num_threads() == c->threads;
        free(j.hits);
        pthread_mutex_destroy(&j.lock);
    }
    return NULL;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int main(void) {
    static const int64_t sizes[] = {-5, 0, 1, 2, 3, 7, 64, 1000, 100003};
    static const int threads[] = {1, 2, 4};
    size_t s, t;
    int distinct, c;
    double before;
    pthread_t tid[2];
    caller callers[2] = {{4, 300, 0, 0}, {2, 300, 0, 0}};

    CHECK(cuvil_get_num_threads() == 1, "default thread count is %d, not 1", cuvil_get_num_threads());
    cuvil_set_num_threads(0);
    CHECK(cuvil_get_num_threads() == 1, "0 threads not clamped to 1");
    cuvil_set_num_threads(100000);
    CHECK(cuvil_get_num_threads() == CUVIL_MAX_THREADS, "100000 threads not clamped");

    for (t = 0; t < sizeof threads / sizeof threads[0]; t++)
        for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) run_loop(threads[t], sizes[s], 0, 0);

    /* Slow chunks: the workers must take some of them (the caller cannot run all four at once). */
    distinct = run_loop(4, 4, 100, 0);
    CHECK(distinct >= 2, "4 threads, 4 slow chunks ran on %d thread(s)", distinct);
    CHECK(run_loop(1, 4, 0, 0) == 1, "1 thread used more than the caller");

    for (t = 0; t < sizeof threads / sizeof threads[0]; t++) run_loop(threads[t], 16, 1, 1); /* nested */

    /* Two callers at once: each loop is right whether it got the pool or ran serially. */
    for (c = 0; c < 2; c++) pthread_create(&tid[c], NULL, caller_main, &callers[c]);
    for (c = 0; c < 2; c++) pthread_join(tid[c], NULL);
    for (c = 0; c < 2; c++) {
        CHECK(callers[c].ok, "concurrent caller %d got a wrong loop", c);
        CHECK(callers[c].default_threads == 1, "a new thread starts with %d threads (thread-local?)",
              callers[c].default_threads);
    }
    cuvil_set_num_threads(4);
    CHECK(cuvil_get_num_threads() == 4, "thread count of the main thread changed by other threads");

    /* Idle workers sleep: half a second of waiting costs (almost) no CPU. */
    run_loop(4, 1000, 0, 0);
    before = cpu_seconds();
    sleep_ms(500);
    CHECK(cpu_seconds() - before < 0.1, "idle pool used %.3f s of CPU in 0.5 s", cpu_seconds() - before);
#if defined(__linux__) && defined(__GLIBC__)
    CHECK(sched_getaffinity(0, sizeof start_mask, &start_mask) == 0, "sched_getaffinity failed");
    cuvil_parallel_for(mask_body, NULL, 4); /* wakes the sleeping workers */
    CHECK(!narrowed, "a worker woken from sleep ran a chunk with a narrowed CPU affinity");
#endif

    printf(failures ? "failed\n" : "ok\n");
    return failures ? 1 : 0;
}
