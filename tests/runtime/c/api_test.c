/* The prefixed C API of one model, through its shared library. Compiled with
 * -DMODEL_HEADER='"<prefix>.h"' -D'P(x)=<prefix>_##x' -D'PU(x)=<PREFIX>_##x'.
 *
 * argv[1]: directory with in<i>.bin (raw inputs); writes out<i>.bin there.
 * Prints the metadata ("input NAME DTYPE RANK d0,d1,.. NBYTES") and one line per
 * check that failed; exits 0 only when everything held. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include MODEL_HEADER

static int failures = 0;
#define CHECK(cond, what)                                   \
    do {                                                    \
        if (!(cond)) {                                      \
            printf("FAIL line %d: %s\n", __LINE__, what);   \
            failures++;                                     \
        }                                                   \
    } while (0)

static int file_io(const char *dir, const char *stem, int i, void *buf, size_t n, int write) {
    char path[4096];
    FILE *f;
    size_t done;
    snprintf(path, sizeof path, "%s/%s%d.bin", dir, stem, i);
    f = fopen(path, write ? "wb" : "rb");
    if (f == NULL) return 0;
    done = write ? fwrite(buf, 1, n, f) : fread(buf, 1, n, f);
    fclose(f);
    return done == n;
}

static void print_meta(const char *kind, int count, const char *(*name)(int), int (*rank)(int),
                       cuvil_status (*shape)(int, int64_t *, int), cuvil_dtype (*dtype)(int), size_t (*nbytes)(int)) {
    int i, k;
    for (i = 0; i < count; i++) {
        int64_t dims[CUVIL_MAX_RANK];
        CHECK(shape(i, dims, CUVIL_MAX_RANK) == CUVIL_OK, "shape query");
        printf("%s %s %s %d ", kind, name(i), cuvil_dtype_name(dtype(i)), rank(i));
        for (k = 0; k < rank(i); k++) printf("%s%lld", k ? "," : "", (long long)dims[k]);
        printf(" %zu\n", nbytes(i));
    }
    CHECK(name(count) == NULL && name(-1) == NULL, "name out of range is not NULL");
    CHECK(rank(count) == -1, "rank out of range is not -1");
    CHECK(dtype(count) == CUVIL_DTYPE_INVALID, "dtype out of range is not INVALID");
    CHECK(nbytes(count) == 0, "nbytes out of range is not 0");
    CHECK(shape(count, NULL, 0) == CUVIL_ERR_INVALID_ARGUMENT, "shape out of range is not an error");
    if (count > 0 && rank(0) > 0) {
        int64_t d[1];
        CHECK(shape(0, d, 0) == CUVIL_ERR_INVALID_ARGUMENT, "shape with no room is not an error");
    }
}

int main(int argc, char **argv) {
    const void *in[PU(INPUT_COUNT) + 1];
    void *out[PU(OUTPUT_COUNT) + 1], *out2[PU(OUTPUT_COUNT) + 1];
    int ni = P(input_count)(), no = P(output_count)(), i;
    P(ctx) *ctx = NULL;
    unsigned char *scratch;
    void *block;
    size_t arena = PU(ARENA_SIZE);
    if (argc != 2) return 2;
    CHECK(ni == PU(INPUT_COUNT) && no == PU(OUTPUT_COUNT), "counts differ from the header's constants");
    print_meta("input", ni, P(input_name), P(input_rank), P(input_shape), P(input_dtype), P(input_nbytes));
    print_meta("output", no, P(output_name), P(output_rank), P(output_shape), P(output_dtype), P(output_nbytes));
    printf("arena %zu\n", arena);
    for (i = 0; i < ni; i++) {
        void *buf = malloc(P(input_nbytes)(i));
        CHECK(file_io(argv[1], "in", i, buf, P(input_nbytes)(i), 0), "read input");
        in[i] = buf;
    }
    for (i = 0; i < no; i++) {
        out[i] = calloc(1, P(output_nbytes)(i));
        out2[i] = calloc(1, P(output_nbytes)(i));
    }
    CHECK(P(create)(NULL) == CUVIL_ERR_INVALID_ARGUMENT, "create(NULL)");
    CHECK(P(create)(&ctx) == CUVIL_OK && ctx != NULL, "create");
    CHECK(P(set_threads)(ctx, 0) == CUVIL_ERR_INVALID_ARGUMENT, "set_threads(0) accepted");
    CHECK(strlen(cuvil_last_error()) > 0, "no last error after a failure");
    CHECK(P(set_threads)(ctx, 2) == CUVIL_OK, "set_threads(2)");
    CHECK(P(run)(ctx, in, out) == CUVIL_OK, "run");
    for (i = 0; i < no; i++) CHECK(file_io(argv[1], "out", i, out[i], P(output_nbytes)(i), 1), "write output");

    CHECK(P(run)(NULL, in, out2) == CUVIL_ERR_INVALID_ARGUMENT, "run(NULL ctx)");
    CHECK(P(run)(ctx, NULL, out2) == CUVIL_ERR_INVALID_ARGUMENT, "run(NULL inputs)");
    CHECK(P(run)(ctx, in, NULL) == CUVIL_ERR_INVALID_ARGUMENT, "run(NULL outputs)");
    printf("error %s | %s\n", cuvil_status_message(CUVIL_ERR_INVALID_ARGUMENT), cuvil_last_error());

    /* Caller-owned scratch: exact size and alignment work, anything less is refused. */
    block = malloc(arena + 128);
    scratch = (unsigned char *)block + (64 - (uintptr_t)block % 64);
    CHECK(P(run_with_scratch)(scratch, arena, in, out2) == CUVIL_OK, "run_with_scratch");
    for (i = 0; i < no; i++) CHECK(memcmp(out[i], out2[i], P(output_nbytes)(i)) == 0, "scratch run differs");
    if (arena > 0) {
        cuvil_status st = P(run_with_scratch)(scratch, arena - 1, in, out2);
        CHECK(st == CUVIL_ERR_SCRATCH_TOO_SMALL, "too-small scratch accepted");
        printf("too_small %d %s\n", (int)st, cuvil_last_error());
        st = P(run_with_scratch)(scratch + 8, arena, in, out2);
        CHECK(st == CUVIL_ERR_SCRATCH_MISALIGNED, "misaligned scratch accepted");
        printf("misaligned %d %s\n", (int)st, cuvil_last_error());
        CHECK(P(run_with_scratch)(NULL, arena, in, out2) == CUVIL_ERR_INVALID_ARGUMENT, "NULL scratch accepted");
    }
    CHECK(P(model_desc)()->arena_size == arena, "descriptor arena size");
    CHECK(P(destroy)(ctx) == CUVIL_OK && P(destroy)(NULL) == CUVIL_OK, "destroy");
    free(block);
    for (i = 0; i < ni; i++) free((void *)in[i]);
    for (i = 0; i < no; i++) {
        free(out[i]);
        free(out2[i]);
    }
    printf(failures ? "failed\n" : "ok\n");
    return failures ? 1 : 0;
}
