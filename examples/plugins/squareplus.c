/* A custom op plugin: the "squareplus" activation, (x + sqrt(x^2 + b)) / 2 (Barron,
 * 2021), which the compiler cannot lower from the model: the model calls it as the
 * torch custom op cuvil_examples::squareplus(x, b) (see models.py), and the config
 * maps that op to this C function (plugin.custom_ops), so the generated code calls
 * cuvil_squareplus with the op's tensor and `b` as params[0].
 */
#include <math.h>

#include "cuvil_plugin.h"

void cuvil_squareplus(const cuvil_op_tensor *out, const cuvil_op_tensor *ins, int32_t n_ins, const double *params,
                      int32_t n_params);

void cuvil_squareplus(const cuvil_op_tensor *out, const cuvil_op_tensor *ins, int32_t n_ins, const double *params,
                      int32_t n_params) {
    const float *x = (const float *)ins[0].data;
    float *y = (float *)out->data;
    float b = n_params > 0 ? (float)params[0] : 4.0f;
    int64_t i;
    (void)n_ins;
    for (i = 0; i < out->count; i++) y[i] = 0.5f * (x[i] + sqrtf(x[i] * x[i] + b));
}

/* No hooks: the descriptor carries the module's ABI signature for the link stage. */
CUVIL_PLUGIN(squareplus);
