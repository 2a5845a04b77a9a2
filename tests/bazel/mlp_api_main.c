/* Runs the MLP through its generated C API (no runtime `main`) on a fixed input and
 * prints the logits, one per line: the same program is built for the host and for
 * wasm32-wasi, and tests/bazel/test_targets.py compares the two. */
#include <stdio.h>

#include "tests/bazel/mlp.h"

int main(void) {
    static float x[784], logits[10];
    const void *inputs[1] = {x};
    void *outputs[1] = {logits};
    mlp_ctx *ctx = NULL;
    cuvil_status st;
    int i;
    for (i = 0; i < 784; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    st = mlp_create(&ctx);
    if (st == CUVIL_OK) st = mlp_run(ctx, inputs, outputs);
    if (st != CUVIL_OK) {
        fprintf(stderr, "mlp_api_main: %s (%s)\n", cuvil_status_message(st), cuvil_last_error());
        mlp_destroy(ctx);
        return 1;
    }
    for (i = 0; i < 10; i++) printf("%.9g\n", logits[i]);
    mlp_destroy(ctx);
    return 0;
}
