/* The machine's fp32 FMA peak: independent FMA chains held in registers, on N threads.
 *
 *   fma_peak THREADS SECONDS     prints "<GFLOP/s> <isa>" (isa: avx512 or avx2)
 *   fma_peak THREADS SECONDS bf16   the bf16 dot-product peak instead ("<GFLOP/s>
 *                                   avx512bf16": 16 chains of vdpbf16ps, 64 FLOP each;
 *                                   exit status 3 where the CPU lacks AVX512-BF16)
 *
 * AVX-512: 16 chains of 16-lane vfmadd (enough to cover 2 FMA units x 4 cycles of
 * latency); AVX2 fallback when the CPU lacks AVX-512F: 12 chains of 8 lanes. The ISA is
 * chosen at run time, so one binary runs on both. Each thread first calibrates its
 * iteration count, then all start together behind a barrier; GFLOP/s is the total FLOP
 * over the slowest thread's time. Built by compare.py with `gcc -O2 -pthread`.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* acc = acc * m + a converges to a / (1 - m): no overflow, no denormals. */
#define FMA16(op, set1, T) \
    T a = set1(seed), m = set1(0.999f); \
    T c0 = set1(0.0f), c1 = set1(0.1f), c2 = set1(0.2f), c3 = set1(0.3f), c4 = set1(0.4f), \
      c5 = set1(0.5f), c6 = set1(0.6f), c7 = set1(0.7f), c8 = set1(0.8f), c9 = set1(0.9f), \
      c10 = set1(1.0f), c11 = set1(1.1f), c12 = set1(1.2f), c13 = set1(1.3f), c14 = set1(1.4f), \
      c15 = set1(1.5f);

__attribute__((target("avx512f,fma"), noinline))
static float loop_avx512(long iters, float seed) {
    FMA16(_mm512_fmadd_ps, _mm512_set1_ps, __m512)
    for (long i = 0; i < iters; i++) {
        c0 = _mm512_fmadd_ps(c0, m, a); c1 = _mm512_fmadd_ps(c1, m, a);
        c2 = _mm512_fmadd_ps(c2, m, a); c3 = _mm512_fmadd_ps(c3, m, a);
        c4 = _mm512_fmadd_ps(c4, m, a); c5 = _mm512_fmadd_ps(c5, m, a);
        c6 = _mm512_fmadd_ps(c6, m, a); c7 = _mm512_fmadd_ps(c7, m, a);
        c8 = _mm512_fmadd_ps(c8, m, a); c9 = _mm512_fmadd_ps(c9, m, a);
        c10 = _mm512_fmadd_ps(c10, m, a); c11 = _mm512_fmadd_ps(c11, m, a);
        c12 = _mm512_fmadd_ps(c12, m, a); c13 = _mm512_fmadd_ps(c13, m, a);
        c14 = _mm512_fmadd_ps(c14, m, a); c15 = _mm512_fmadd_ps(c15, m, a);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                       _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"), noinline))
static float loop_avx2(long iters, float seed) {
    FMA16(_mm256_fmadd_ps, _mm256_set1_ps, __m256)
    (void)c12; (void)c13; (void)c14; (void)c15;
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, m, a); c1 = _mm256_fmadd_ps(c1, m, a);
        c2 = _mm256_fmadd_ps(c2, m, a); c3 = _mm256_fmadd_ps(c3, m, a);
        c4 = _mm256_fmadd_ps(c4, m, a); c5 = _mm256_fmadd_ps(c5, m, a);
        c6 = _mm256_fmadd_ps(c6, m, a); c7 = _mm256_fmadd_ps(c7, m, a);
        c8 = _mm256_fmadd_ps(c8, m, a); c9 = _mm256_fmadd_ps(c9, m, a);
        c10 = _mm256_fmadd_ps(c10, m, a); c11 = _mm256_fmadd_ps(c11, m, a);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

/* 16 chains of vdpbf16ps: acc += a.lo*b.lo + a.hi*b.hi per lane (tiny products, so the
 * sums stay finite and normal for any run length). */
__attribute__((target("avx512f,avx512bf16"), noinline))
static float loop_bf16(long iters, float seed) {
    __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(seed));
    __m512bh m = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
    __m512 c[16];
    for (int j = 0; j < 16; j++) c[j] = _mm512_set1_ps(0.1f * (float)j);
    for (long i = 0; i < iters; i++) {
        c[0] = _mm512_dpbf16_ps(c[0], a, m); c[1] = _mm512_dpbf16_ps(c[1], a, m);
        c[2] = _mm512_dpbf16_ps(c[2], a, m); c[3] = _mm512_dpbf16_ps(c[3], a, m);
        c[4] = _mm512_dpbf16_ps(c[4], a, m); c[5] = _mm512_dpbf16_ps(c[5], a, m);
        c[6] = _mm512_dpbf16_ps(c[6], a, m); c[7] = _mm512_dpbf16_ps(c[7], a, m);
        c[8] = _mm512_dpbf16_ps(c[8], a, m); c[9] = _mm512_dpbf16_ps(c[9], a, m);
        c[10] = _mm512_dpbf16_ps(c[10], a, m); c[11] = _mm512_dpbf16_ps(c[11], a, m);
        c[12] = _mm512_dpbf16_ps(c[12], a, m); c[13] = _mm512_dpbf16_ps(c[13], a, m);
        c[14] = _mm512_dpbf16_ps(c[14], a, m); c[15] = _mm512_dpbf16_ps(c[15], a, m);
    }
    __m512 s = c[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, c[j]);
    return _mm512_reduce_add_ps(s);
}

static int use_avx512, use_bf16;
static double flop_per_iter;
static double seconds;
static pthread_barrier_t barrier;
static volatile float sink;

static float run_loop(long iters) {
    if (use_bf16) return loop_bf16(iters, 1e-3f);
    return use_avx512 ? loop_avx512(iters, 1e-3f) : loop_avx2(iters, 1e-3f);
}

typedef struct { long iters; double elapsed; } job;

static void *worker(void *arg) {
    job *j = arg;
    long n = 1 << 16;  /* calibrate: grow until ~1/8 of the target time */
    for (;;) {
        double t0 = now();
        sink += run_loop(n);
        double dt = now() - t0;
        if (dt >= seconds / 8 || n > (1L << 40)) { j->iters = (long)((double)n * seconds / dt) + 1; break; }
        n *= 2;
    }
    pthread_barrier_wait(&barrier);
    double t0 = now();
    sink += run_loop(j->iters);
    j->elapsed = now() - t0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "bf16") == 0)) {
        fprintf(stderr, "usage: %s THREADS SECONDS [bf16]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    seconds = atof(argv[2]);
    if (threads < 1 || threads > 1024 || !(seconds > 0)) {
        fprintf(stderr, "fma_peak: bad arguments\n");
        return 2;
    }
    __builtin_cpu_init();
    use_avx512 = __builtin_cpu_supports("avx512f");
    if (!use_avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        fprintf(stderr, "fma_peak: neither AVX-512F nor AVX2+FMA on this CPU\n");
        return 1;
    }
    if (argc == 4) {
        if (!use_avx512 || !__builtin_cpu_supports("avx512bf16")) {
            fprintf(stderr, "fma_peak: no AVX512-BF16 on this CPU\n");
            return 3;
        }
        use_bf16 = 1;
    }
    flop_per_iter = use_bf16 ? 16.0 * 16 * 4 : use_avx512 ? 16.0 * 16 * 2 : 12.0 * 8 * 2;
    pthread_t tid[1024];
    job jobs[1024];
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, worker, &jobs[i]);
    double flop = 0, slowest = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        flop += (double)jobs[i].iters * flop_per_iter;
        if (jobs[i].elapsed > slowest) slowest = jobs[i].elapsed;
    }
    printf("%.3f %s\n", flop / slowest * 1e-9, use_bf16 ? "avx512bf16" : use_avx512 ? "avx512" : "avx2");
    return 0;
}
