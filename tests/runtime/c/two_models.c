/* Two models in one program: both headers in this file, both static archives linked.
 * argv[1]: directory with a_in0.bin (tiny_cnn) and b_in<i>.bin (two_io); writes
 * a_out0.bin and b_out<i>.bin. Then each model runs 20 times on its own thread (one
 * context per thread, two threads each) and must reproduce its first outputs. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiny_cnn.h"
#include "two_io.h"

typedef struct {
    const cuvil_model_desc *model;
    const void *in[4];
    void *out[4], *again[4];
    int ok;
} runner;

static int file_io(const char *dir, const char *name, void *buf, size_t n, int write) {
    char path[4096];
    FILE *f;
    size_t done;
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    if ((f = fopen(path, write ? "wb" : "rb")) == NULL) return 0;
    done = write ? fwrite(buf, 1, n, f) : fread(buf, 1, n, f);
    fclose(f);
    return done == n;
}

static void *repeat(void *arg) {
    runner *r = (runner *)arg;
    cuvil_ctx *ctx;
    int k, i;
    r->ok = cuvil_ctx_create(r->model, &ctx) == CUVIL_OK && cuvil_ctx_set_threads(ctx, 2) == CUVIL_OK;
    for (k = 0; k < 20 && r->ok; k++) {
        r->ok &= cuvil_ctx_run(ctx, r->in, r->again) == CUVIL_OK;
        for (i = 0; i < r->model->n_outputs; i++)
            r->ok &= memcmp(r->out[i], r->again[i], (size_t)r->model->outputs[i].nbytes) == 0;
    }
    cuvil_ctx_destroy(ctx);
    return NULL;
}

static int load(runner *r, const cuvil_model_desc *m, const char *dir, char tag) {
    int i;
    char name[32];
    r->model = m;
    for (i = 0; i < m->n_inputs; i++) {
        void *buf = malloc((size_t)m->inputs[i].nbytes);
        snprintf(name, sizeof name, "%c_in%d", tag, i);
        if (!file_io(dir, name, buf, (size_t)m->inputs[i].nbytes, 0)) return 0;
        r->in[i] = buf;
    }
    for (i = 0; i < m->n_outputs; i++) {
        r->out[i] = calloc(1, (size_t)m->outputs[i].nbytes);
        r->again[i] = calloc(1, (size_t)m->outputs[i].nbytes);
    }
    return 1;
}

int main(int argc, char **argv) {
    runner a, b;
    tiny_cnn_ctx *ca;
    two_io_ctx *cb;
    pthread_t ta, tb;
    int i;
    char name[32];
    if (argc != 2) return 2;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (!load(&a, tiny_cnn_model_desc(), argv[1], 'a') || !load(&b, two_io_model_desc(), argv[1], 'b')) {
        printf("cannot read inputs\n");
        return 1;
    }
    if (tiny_cnn_create(&ca) != CUVIL_OK || two_io_create(&cb) != CUVIL_OK ||
        tiny_cnn_run(ca, a.in, a.out) != CUVIL_OK || two_io_run(cb, b.in, b.out) != CUVIL_OK) {
        printf("run failed: %s\n", cuvil_last_error());
        return 1;
    }
    tiny_cnn_destroy(ca);
    two_io_destroy(cb);
    for (i = 0; i < TINY_CNN_OUTPUT_COUNT; i++) {
        snprintf(name, sizeof name, "a_out%d", i);
        file_io(argv[1], name, a.out[i], tiny_cnn_output_nbytes(i), 1);
    }
    for (i = 0; i < TWO_IO_OUTPUT_COUNT; i++) {
        snprintf(name, sizeof name, "b_out%d", i);
        file_io(argv[1], name, b.out[i], two_io_output_nbytes(i), 1);
    }
    pthread_create(&ta, NULL, repeat, &a);
    pthread_create(&tb, NULL, repeat, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    printf("%s %s %s\n", tiny_cnn_input_name(0), two_io_input_name(1), a.ok && b.ok ? "ok" : "threads differ");
    return a.ok && b.ok ? 0 : 1;
}
