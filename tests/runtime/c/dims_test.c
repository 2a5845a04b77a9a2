/* The C API of a model with symbolic dims (batch b, length s): for each (b, s) on the
 * command line, set both inputs' shapes, run, print the output's shape and write its data
 * to out_<b>_<s>.bin; then the refusals (bounds, disagreeing inputs, fixed dims). Inputs are
 * in_<b>_<s>_<i>.bin, written by the test. Compiled with -DMODEL_HEADER and -DP(x). */
#include <stdio.h>
#include <stdlib.h>

#include MODEL_HEADER

static int read_file(const char *path, void *dst, size_t n) {
    FILE *f = fopen(path, "rb");
    size_t got;
    if (f == NULL) return 0;
    got = fread(dst, 1, n, f);
    fclose(f);
    return got == n;
}

int main(int argc, char **argv) {
    P(ctx) *ctx;
    int a;
    int64_t dims[4];
    static float x[4 * 64 * 8], y[4 * 64], out[4 * 64 * 8];
    if (P(create)(&ctx) != CUVIL_OK) {
        printf("create failed: %s\n", cuvil_last_error());
        return 1;
    }
    for (a = 1; a + 1 < argc; a += 2) {
        long b = atol(argv[a]), s = atol(argv[a + 1]);
        char path[64];
        int64_t xs[3], ys[2];
        const void *in[2];
        void *outs[1];
        FILE *f;
        xs[0] = b; xs[1] = s; xs[2] = 8;
        ys[0] = b; ys[1] = s;
        snprintf(path, sizeof path, "in_%ld_%ld_0.bin", b, s);
        if (!read_file(path, x, (size_t)(b * s * 8) * sizeof(float))) return 2;
        snprintf(path, sizeof path, "in_%ld_%ld_1.bin", b, s);
        if (!read_file(path, y, (size_t)(b * s) * sizeof(float))) return 2;
        in[0] = x;
        in[1] = y;
        outs[0] = out;
        if (P(set_input_shape)(ctx, 0, xs, 3) != CUVIL_OK || P(set_input_shape)(ctx, 1, ys, 2) != CUVIL_OK ||
            P(run)(ctx, in, outs) != CUVIL_OK || P(ctx_output_shape)(ctx, 0, dims, 4) != CUVIL_OK) {
            printf("run %ld %ld failed: %s\n", b, s, cuvil_last_error());
            return 1;
        }
        printf("shape %lld %lld %lld\n", (long long)dims[0], (long long)dims[1], (long long)dims[2]);
        snprintf(path, sizeof path, "out_%ld_%ld.bin", b, s);
        f = fopen(path, "wb");
        fwrite(out, sizeof(float), (size_t)(dims[0] * dims[1] * dims[2]), f);
        fclose(f);
    }
    dims[0] = 5; dims[1] = 3; dims[2] = 8;
    printf("bounds %d %s\n", P(set_input_shape)(ctx, 0, dims, 3), cuvil_last_error());
    dims[0] = 2; dims[1] = 3; dims[2] = 7;
    printf("fixed %d %s\n", P(set_input_shape)(ctx, 0, dims, 3), cuvil_last_error());
    dims[0] = 2; dims[1] = 3; dims[2] = 8;
    P(set_input_shape)(ctx, 0, dims, 3);
    dims[0] = 3;
    P(set_input_shape)(ctx, 1, dims, 2);
    {
        const void *in[2];
        void *outs[1];
        in[0] = x;
        in[1] = y;
        outs[0] = out;
        printf("disagree %d %s\n", P(run)(ctx, in, outs), cuvil_last_error());
    }
    P(destroy)(ctx);
    printf("ok\n");
    return 0;
}
