/* Cold start of a Cuvil shared library, as a C program that deploys it would do it:
 * dlopen the library, create a context, set the thread count, run once on raw input
 * files (C order, the declared dtype), print the sum of the first output as float32.
 *
 *   cuvil_run LIB.so PREFIX THREADS INPUT.bin...
 *
 * Only the model's generated C API is used (<prefix>_create / _set_threads / _run /
 * _input_count / _input_nbytes / _output_count / _output_nbytes). Built by compare.py
 * with `gcc -O2 ... -ldl`.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*create_fn)(void **);
typedef int (*threads_fn)(void *, int);
typedef int (*run_fn)(void *, const void *const *, void *const *);
typedef int (*count_fn)(void);
typedef size_t (*nbytes_fn)(int);
typedef const char *(*error_fn)(void);

static void *lib;

static void *sym(const char *prefix, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    void *p = dlsym(lib, name);
    if (p == NULL) {
        fprintf(stderr, "cuvil_run: %s not found in the library\n", name);
        exit(1);
    }
    return p;
}

static void fail(const char *what) {
    error_fn last = (error_fn)dlsym(lib, "cuvil_last_error");
    fprintf(stderr, "cuvil_run: %s failed: %s\n", what, last ? last() : "?");
    exit(1);
}

static void *aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        fprintf(stderr, "cuvil_run: out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIB.so PREFIX THREADS INPUT.bin...\n", argv[0]);
        return 2;
    }
    const char *prefix = argv[2];
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "cuvil_run: %s\n", dlerror());
        return 1;
    }
    int n_in = ((count_fn)sym(prefix, "_input_count"))();
    int n_out = ((count_fn)sym(prefix, "_output_count"))();
    nbytes_fn in_bytes = (nbytes_fn)sym(prefix, "_input_nbytes");
    nbytes_fn out_bytes = (nbytes_fn)sym(prefix, "_output_nbytes");
    if (argc - 4 != n_in) {
        fprintf(stderr, "cuvil_run: the model takes %d inputs, got %d files\n", n_in, argc - 4);
        return 2;
    }
    const void **ins = calloc((size_t)n_in + 1, sizeof *ins);
    void **outs = calloc((size_t)n_out + 1, sizeof *outs);
    for (int i = 0; i < n_in; i++) {
        size_t want = in_bytes(i);
        void *buf = aligned(want);
        FILE *f = fopen(argv[4 + i], "rb");
        if (f == NULL || fread(buf, 1, want, f) != want || fgetc(f) != EOF) {
            fprintf(stderr, "cuvil_run: %s is not %zu bytes\n", argv[4 + i], want);
            return 1;
        }
        fclose(f);
        ins[i] = buf;
    }
    for (int i = 0; i < n_out; i++) outs[i] = aligned(out_bytes(i));
    void *ctx = NULL;
    if (((create_fn)sym(prefix, "_create"))(&ctx) != 0) fail("create");
    if (((threads_fn)sym(prefix, "_set_threads"))(ctx, atoi(argv[3])) != 0) fail("set_threads");
    if (((run_fn)sym(prefix, "_run"))(ctx, ins, outs) != 0) fail("run");
    double sum = 0;
    const float *y = outs[0];
    for (size_t i = 0; i < out_bytes(0) / sizeof(float); i++) sum += y[i];
    printf("%.9g\n", sum);
    return 0;
}
