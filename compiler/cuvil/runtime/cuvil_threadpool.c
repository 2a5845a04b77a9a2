/* The process-wide thread pool behind cuvil_parallel_for.
 *
 * One job at a time: the caller that finds the pool idle posts its job (fn, ctx,
 * n split into min(threads, n) contiguous chunks) and works on it too; a second
 * caller that finds the pool busy runs its loop serially instead of waiting or
 * oversubscribing the machine. Workers are started lazily, grown to the largest
 * thread count asked for, spin for SPIN_NS (2 ms) after a job (the poster spins as
 * long for the last chunk) and then sleep on a condition variable. Chunks are
 * claimed with a compare-and-swap on one word holding (job id, next chunk), so a
 * worker that wakes late can never take a chunk of a newer job with an older job's
 * function.
 *
 * On Linux with glibc, a caller that wakes sleeping workers first steers them off its
 * own CPU (their affinity minus the caller's CPU; each worker widens it back once it
 * runs): the scheduler tends to wake a thread on its waker's CPU, and there the worker
 * waits behind the spinning caller. Measured on a 2-vCPU VM, MiniLM at 2 threads after
 * 100 ms idle: caller and worker each spent ~3 ms of a 12 ms call waiting in the
 * same run queue; back to back the call takes 6.7 ms.
 */
#define _GNU_SOURCE
#include "cuvil_runtime.h"

typedef void (*cuvil_task_fn)(void *ctx, int64_t begin, int64_t end);

static int clamp_threads(int n) { return n < 1 ? 1 : (n > CUVIL_MAX_THREADS ? CUVIL_MAX_THREADS : n); }

#if defined(__wasi__)

static int requested_threads = 1;

void cuvil_parallel_for(cuvil_task_fn fn, void *ctx, int64_t n) {
    if (n > 0) fn(ctx, 0, n);
}
void cuvil_set_num_threads(int n) { requested_threads = clamp_threads(n); }
int cuvil_get_num_threads(void) { return requested_threads; }

#else

#include <pthread.h>
#include <time.h>
#include <sched.h>
#if defined(__linux__) && defined(__GLIBC__)
#define STEER_WORKERS 1
#endif

/* How long an idle worker (and a caller whose chunks are done) spins before sleeping:
 * 2 ms. Back-to-back kernels come within microseconds, but a worker that does fall
 * asleep can take milliseconds to run again where the CPU is a VM's vCPU that halted
 * (measured on a 2-vCPU VM: ResNet-50 at 2 threads right after 100 ms idle, 24-50 ms
 * with a 50 us spin, 25-29 ms with 2 ms). Timed, not counted: PAUSE takes ~10 to ~140
 * cycles depending on the CPU. */
#define SPIN_NS 2000000
/* After this many rounds of 16 PAUSEs (~25 us) a spinning thread yields between rounds:
 * where the thread it waits for shares its CPU (woken there, or moved there by the
 * scheduler), spinning would hold that thread off until the time slice ends. Measured
 * with 4 chunks per thread (MiniLM, 2 threads), where that happened every call: 26.7
 * -> 7.4 ms; with one chunk per thread, unchanged (7.2 / 7.3 ms). */
#define YIELD_AFTER 64

static __thread int tls_threads = 1;
static __thread int tls_in_task = 0;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* workers wait here for a new job */
    pthread_cond_t done; /* the posting caller waits here for the last chunk */
    int busy; /* a caller owns the pool (under lock) */
    int workers; /* started so far (under lock) */
    cuvil_task_fn fn; /* the current job, written under lock before `job` */
    void *ctx;
    int64_t n;
    uint32_t chunks;
    uint32_t job; /* id of the current job (atomic; written under lock) */
    uint64_t claim; /* (job id << 32) | next chunk to claim (atomic) */
    uint32_t remaining; /* chunks of the current job not yet finished (atomic) */
    pthread_t thread[CUVIL_MAX_THREADS]; /* the workers (under lock) */
    uint32_t first_job[CUVIL_MAX_THREADS]; /* the job id when each worker started */
    int asleep[CUVIL_MAX_THREADS]; /* 1: waiting on `wake`; 2: and steered (under lock) */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0,
          {0}, {0}, {0}};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("pause");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spin for up to SPIN_NS while *word == value (until_zero: while *word != 0). */
static void spin(const uint32_t *word, uint32_t value, int until_zero) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        int k;
        for (k = 0; k < 16; k++) {
            uint32_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
            if (until_zero ? now == 0 : now != value) return;
            cpu_relax();
        }
        if (i == 0)
            deadline = now_ns() + SPIN_NS;
        else if (now_ns() > deadline)
            return;
        else if (i >= YIELD_AFTER)
            sched_yield();
    }
}

static int64_t chunk_begin(int64_t n, uint32_t chunks, uint32_t k) {
    int64_t q = n / chunks, r = n % chunks;
    return (int64_t)k * q + ((int64_t)k < r ? (int64_t)k : r);
}

/* Claim and run chunks of job `id` until none is left. */
static void run_chunks(uint32_t id, cuvil_task_fn fn, void *ctx, int64_t n, uint32_t chunks) {
    uint64_t cur = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t k = (uint32_t)cur;
        if ((uint32_t)(cur >> 32) != id || k >= chunks) return;
        if (!__atomic_compare_exchange_n(&pool.claim, &cur, cur + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue; /* `cur` now holds the fresh value */
        fn(ctx, chunk_begin(n, chunks, k), chunk_begin(n, chunks, k + 1));
        if (__atomic_sub_fetch(&pool.remaining, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
        cur = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
    }
}

#ifdef STEER_WORKERS
/* Before waking sleeping workers (under lock): move each off the caller's CPU. */
static void steer_sleepers(void) {
    int i, cpu = sched_getcpu();
    for (i = 0; cpu >= 0 && cpu < CPU_SETSIZE && i < pool.workers; i++) {
        cpu_set_t set;
        if (pool.asleep[i] != 1 || pthread_getaffinity_np(pool.thread[i], sizeof set, &set) != 0) continue;
        CPU_CLR(cpu, &set);
        if (CPU_COUNT(&set) > 0 && pthread_setaffinity_np(pool.thread[i], sizeof set, &set) == 0) pool.asleep[i] = 2;
    }
}
#endif

static void *worker_main(void *arg) {
    int me = (int)(intptr_t)arg;
    uint32_t seen = pool.first_job[me];
#ifdef STEER_WORKERS
    cpu_set_t allowed;
    int have_mask = pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) == 0;
#endif
    tls_in_task = 1; /* everything a worker runs is a task: nested loops run serially */
    for (;;) {
        cuvil_task_fn fn;
        void *ctx;
        int64_t n;
        uint32_t chunks;
        int steered;
        spin(&pool.job, seen, 0);
        pthread_mutex_lock(&pool.lock);
        while (pool.job == seen) {
            pool.asleep[me] = 1;
            pthread_cond_wait(&pool.wake, &pool.lock);
        }
        steered = pool.asleep[me] == 2;
        pool.asleep[me] = 0;
        seen = pool.job;
        fn = pool.fn;
        ctx = pool.ctx;
        n = pool.n;
        chunks = pool.chunks;
        pthread_mutex_unlock(&pool.lock);
#ifdef STEER_WORKERS
        if (steered && have_mask) pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
#else
        (void)steered;
#endif
        run_chunks(seen, fn, ctx, n, chunks);
    }
    return NULL;
}

/* Start workers until there are `want` (under lock). Fewer is fine: the caller
 * and the workers that did start claim every chunk between them. */
static void grow_pool(int want) {
    pthread_attr_t attr;
    if (pool.workers >= want || pthread_attr_init(&attr) != 0) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.workers < want) {
        pool.first_job[pool.workers] = pool.job;
        if (pthread_create(&pool.thread[pool.workers], &attr, worker_main, (void *)(intptr_t)pool.workers) != 0)
            break;
        pool.workers++;
    }
    pthread_attr_destroy(&attr);
}

void cuvil_parallel_for(cuvil_task_fn fn, void *ctx, int64_t n) {
    uint32_t chunks, id;
    int threads = tls_threads;
    if (n <= 0) return;
    if (threads <= 1 || n == 1 || tls_in_task) {
        fn(ctx, 0, n);
        return;
    }
    chunks = (uint32_t)((int64_t)threads < n ? (int64_t)threads : n);
    pthread_mutex_lock(&pool.lock);
    if (pool.busy) { /* another context is running: do not wait, do not oversubscribe */
        pthread_mutex_unlock(&pool.lock);
        tls_in_task = 1;
        fn(ctx, 0, n);
        tls_in_task = 0;
        return;
    }
    pool.busy = 1;
    grow_pool((int)chunks - 1);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunks = chunks;
    id = pool.job + 1;
    __atomic_store_n(&pool.remaining, chunks, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.claim, (uint64_t)id << 32, __ATOMIC_RELEASE);
    __atomic_store_n(&pool.job, id, __ATOMIC_RELEASE);
#ifdef STEER_WORKERS
    steer_sleepers();
#endif
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    tls_in_task = 1;
    run_chunks(id, fn, ctx, n, chunks);
    tls_in_task = 0;

    spin(&pool.remaining, 0, 1);
    pthread_mutex_lock(&pool.lock);
    while (__atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pool.busy = 0;
    pthread_mutex_unlock(&pool.lock);
}

void cuvil_set_num_threads(int n) { tls_threads = clamp_threads(n); }
int cuvil_get_num_threads(void) { return tls_threads; }

#endif
