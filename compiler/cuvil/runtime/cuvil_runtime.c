/* Cuvil runtime: error messages, dtypes, contexts and runs (see cuvil_runtime.h). */
#define _POSIX_C_SOURCE 200809L
#include "cuvil_runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__wasi__) && !defined(_REENTRANT)
#define CUVIL_TLS
#else
#define CUVIL_TLS __thread
#endif

struct cuvil_ctx {
    const cuvil_model_desc *model;
    void *block; /* what malloc returned */
    uint8_t *arena; /* `block` rounded up to CUVIL_ARENA_ALIGN */
    int threads;
    int running; /* set while a run is in progress (atomic) */
    /* Symbolic dims: their values for the next run, each input's shape as set, and the
     * current descriptors (inputs then outputs) with their shapes in `shapes`. */
    int64_t values[CUVIL_MAX_DIMS];
    int64_t *given;            /* inputs' dims as set, flattened like input_dim_symbols */
    int64_t *shapes;           /* every tensor's current dims, flattened */
    uint32_t produced;         /* bit s: dim s is produced by the run (no input gives it) */
    cuvil_tensor_desc *current;
};

static CUVIL_TLS char last_error[512];

const char *cuvil_status_message(cuvil_status status) {
    switch (status) {
    case CUVIL_OK: return "ok";
    case CUVIL_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CUVIL_ERR_OUT_OF_MEMORY: return "out of memory";
    case CUVIL_ERR_SCRATCH_TOO_SMALL: return "scratch buffer smaller than the model's arena size";
    case CUVIL_ERR_SCRATCH_MISALIGNED: return "scratch buffer not 64-byte aligned";
    case CUVIL_ERR_BUSY: return "context is already running on another thread";
    case CUVIL_ERR_IO: return "input/output error";
    case CUVIL_ERR_FORMAT: return "malformed input file";
    case CUVIL_ERR_SHAPE: return "shape does not match the model";
    case CUVIL_ERR_DTYPE: return "dtype does not match the model";
    case CUVIL_ERR_UNSUPPORTED: return "unsupported input";
    case CUVIL_ERR_TOO_LARGE: return "size too large";
    case CUVIL_ERR_ABI: return "built for another target or ABI version";
    }
    return "unknown status code";
}

const char *cuvil_last_error(void) { return last_error; }

cuvil_status cuvil_fail(cuvil_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* The signature lives in read-only data of every runtime object file that defines
 * this function, which is how the link stage finds the runtime's target and ABI. */
static const char runtime_signature[] = CUVIL_RUNTIME_SIGNATURE;

const char *cuvil_runtime_signature(void) { return runtime_signature; }

/* The value of `key` in a signature, copied into buf ("" when absent). */
static const char *signature_field(const char *sig, const char *key, char *buf, size_t cap) {
    size_t klen = strlen(key);
    const char *p = strncmp(sig, CUVIL_SIGNATURE_MAGIC, sizeof CUVIL_SIGNATURE_MAGIC - 1) == 0
                        ? sig + sizeof CUVIL_SIGNATURE_MAGIC - 1
                        : sig;
    buf[0] = '\0';
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t n = len - klen - 1 < cap - 1 ? len - klen - 1 : cap - 1;
            memcpy(buf, p + klen + 1, n);
            buf[n] = '\0';
            break;
        }
        if (!end) break;
        p = end + 1;
    }
    return buf;
}

cuvil_status cuvil_check_signature(const char *what, const char *signature) {
    char abi[16], triple[64], version[32];
    if (signature == NULL) return CUVIL_OK;
    if (strncmp(signature, CUVIL_SIGNATURE_MAGIC, sizeof CUVIL_SIGNATURE_MAGIC - 1) != 0)
        return cuvil_fail(CUVIL_ERR_ABI, "%s has no Cuvil ABI signature; this runtime is Cuvil ABI %d for %s", what,
                          CUVIL_ABI_VERSION, CUVIL_TARGET_TRIPLE);
    signature_field(signature, "abi", abi, sizeof abi);
    signature_field(signature, "triple", triple, sizeof triple);
    signature_field(signature, "runtime", version, sizeof version);
    if (strcmp(triple, CUVIL_TARGET_TRIPLE) != 0 || atoi(abi) != CUVIL_ABI_VERSION)
        return cuvil_fail(CUVIL_ERR_ABI,
                          "%s was built for %s (Cuvil ABI %s, runtime %s), but this runtime is for %s (Cuvil ABI "
                          "%d, runtime %s): rebuild it with this Cuvil for this target",
                          what, triple[0] ? triple : "?", abi[0] ? abi : "?", version[0] ? version : "?",
                          CUVIL_TARGET_TRIPLE, CUVIL_ABI_VERSION, CUVIL_RUNTIME_VERSION);
    return CUVIL_OK;
}

size_t cuvil_dtype_size(cuvil_dtype dtype) {
    switch (dtype) {
    case CUVIL_F64: case CUVIL_I64: return 8;
    case CUVIL_F32: case CUVIL_I32: return 4;
    case CUVIL_F16: return 2;
    case CUVIL_I8: case CUVIL_U8: case CUVIL_BOOL: return 1;
    case CUVIL_DTYPE_INVALID: break;
    }
    return 0;
}

const char *cuvil_dtype_name(cuvil_dtype dtype) {
    static const char *const names[] = {"invalid", "f32", "f16", "f64", "i64", "i32", "i8", "u8", "bool"};
    if ((int)dtype < 0 || (int)dtype >= (int)(sizeof names / sizeof names[0])) return names[0];
    return names[dtype];
}

static cuvil_status check_model(const cuvil_model_desc *model) {
    if (model == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model descriptor is NULL");
    if (model->abi_version != CUVIL_ABI_VERSION)
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "model %s was generated for runtime ABI %d, this runtime is ABI %d",
                          model->prefix ? model->prefix : "?", model->abi_version, CUVIL_ABI_VERSION);
    if ((model->n_dims == 0 ? model->forward == NULL
                            : (model->forward_dims == NULL || model->shapes == NULL || model->dims == NULL ||
                               model->input_dim_symbols == NULL || model->n_dims > CUVIL_MAX_DIMS)) ||
        model->n_dims < 0 || model->n_inputs < 0 || model->n_outputs < 0)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model descriptor %s is incomplete",
                          model->prefix ? model->prefix : "?");
    if (model->signature != NULL) {
        char what[96];
        snprintf(what, sizeof what, "model %s", model->prefix ? model->prefix : "?");
        return cuvil_check_signature(what, model->signature);
    }
    return CUVIL_OK;
}

const cuvil_tensor_desc *cuvil_model_tensor(const cuvil_model_desc *model, int is_output, int i) {
    if (model == NULL) return NULL;
    if (is_output) return (i >= 0 && i < model->n_outputs) ? &model->outputs[i] : NULL;
    return (i >= 0 && i < model->n_inputs) ? &model->inputs[i] : NULL;
}

cuvil_status cuvil_tensor_shape(const cuvil_tensor_desc *t, int64_t *dims, int max_dims) {
    int k;
    if (t == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "tensor index out of range");
    if (t->rank > 0 && dims == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "dims is NULL");
    if (max_dims < t->rank)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "tensor %s has rank %d, room given for %d dims", t->name,
                          t->rank, max_dims);
    for (k = 0; k < t->rank; k++) dims[k] = t->shape[k];
    return CUVIL_OK;
}

static int total_rank(const cuvil_tensor_desc *t, int n) {
    int i, r = 0;
    for (i = 0; i < n; i++) r += t[i].rank;
    return r;
}

/* The current descriptors from the symbol values (shapes, counts, byte sizes). */
static void update_current(cuvil_ctx *ctx) {
    const cuvil_model_desc *m = ctx->model;
    int i, k, n = m->n_inputs + m->n_outputs;
    int64_t *dims = ctx->shapes;
    m->shapes(ctx->values, ctx->shapes);
    for (i = 0; i < n; i++) {
        cuvil_tensor_desc *t = &ctx->current[i];
        int64_t count = 1;
        for (k = 0; k < t->rank; k++) count *= dims[k];
        t->shape = t->rank ? dims : NULL;
        t->count = count;
        t->nbytes = (uint64_t)count * cuvil_dtype_size(t->dtype);
        dims += t->rank;
    }
}

/* The dims no input's shape gives (bit s for dim s): the run produces them (data-
 * dependent sizes, such as nonzero's count), storing their values into its symbol values. */
static uint32_t produced_dims(const cuvil_model_desc *m) {
    uint32_t mask = (1u << m->n_dims) - 1u; /* n_dims <= CUVIL_MAX_DIMS (16), checked */
    int i, n = total_rank(m->inputs, m->n_inputs);
    for (i = 0; i < n; i++)
        if (m->input_dim_symbols[i] >= 0) mask &= ~(1u << m->input_dim_symbols[i]);
    return mask;
}

/* Produced dims back at their upper bounds: the output descriptors then size buffers
 * that hold any run's result (after a run they give the sizes it produced). */
static void reset_produced(cuvil_ctx *ctx) {
    int s;
    for (s = 0; s < ctx->model->n_dims; s++)
        if (ctx->produced & (1u << s)) ctx->values[s] = ctx->model->dims[s].max;
}

static cuvil_status init_dims(cuvil_ctx *ctx) {
    const cuvil_model_desc *m = ctx->model;
    int i, n = m->n_inputs + m->n_outputs;
    int in_rank = total_rank(m->inputs, m->n_inputs), all = in_rank + total_rank(m->outputs, m->n_outputs);
    ctx->given = (int64_t *)calloc((size_t)in_rank + 1, sizeof(int64_t));
    ctx->shapes = (int64_t *)calloc((size_t)all + 1, sizeof(int64_t));
    ctx->current = (cuvil_tensor_desc *)calloc((size_t)n + 1, sizeof(cuvil_tensor_desc));
    if (ctx->given == NULL || ctx->shapes == NULL || ctx->current == NULL)
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "model %s: cannot allocate the shape tables", m->prefix);
    for (i = 0; i < m->n_dims; i++) ctx->values[i] = m->dims[i].max;
    ctx->produced = produced_dims(m);
    for (i = 0; i < m->n_inputs; i++) ctx->current[i] = m->inputs[i];
    for (i = 0; i < m->n_outputs; i++) ctx->current[m->n_inputs + i] = m->outputs[i];
    update_current(ctx);
    memcpy(ctx->given, ctx->shapes, (size_t)in_rank * sizeof(int64_t));
    return CUVIL_OK;
}

const cuvil_tensor_desc *cuvil_ctx_tensor(const cuvil_ctx *ctx, int is_output, int i) {
    const cuvil_model_desc *m;
    if (ctx == NULL) return NULL;
    m = ctx->model;
    if (is_output ? (i < 0 || i >= m->n_outputs) : (i < 0 || i >= m->n_inputs)) return NULL;
    if (m->n_dims == 0) return cuvil_model_tensor(m, is_output, i);
    return &ctx->current[is_output ? m->n_inputs + i : i];
}

static void format_shape(char *buf, size_t cap, const int64_t *dims, int rank) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    int k;
    for (k = 0; k < rank && n < cap; k++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", k ? ", " : "", (long long)dims[k]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

cuvil_status cuvil_ctx_set_input_shape(cuvil_ctx *ctx, int i, const int64_t *dims, int rank) {
    const cuvil_model_desc *m;
    const cuvil_tensor_desc *t;
    const int32_t *syms;
    char have[160], want[160];
    int j, k, off = 0;
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "set_input_shape: context is NULL");
    m = ctx->model;
    if (__atomic_load_n(&ctx->running, __ATOMIC_ACQUIRE)) /* its run would read the new shapes mid-way */
        return cuvil_fail(CUVIL_ERR_BUSY, "model %s: set_input_shape while the context is running on another "
                          "thread; use one context per thread", m->prefix);
    if (i < 0 || i >= m->n_inputs)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s has %d inputs, no input %d", m->prefix, m->n_inputs, i);
    t = &m->inputs[i];
    if (rank > 0 && dims == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "set_input_shape: dims is NULL");
    format_shape(have, sizeof have, dims, rank < 0 ? 0 : rank);
    for (j = 0; j < i; j++) off += m->inputs[j].rank;
    syms = m->n_dims ? m->input_dim_symbols + off : NULL;
    if (rank != t->rank)
        return cuvil_fail(CUVIL_ERR_SHAPE, "input %s: shape %s has %d dims, the model's has %d", t->name, have, rank,
                          t->rank);
    for (k = 0; k < rank; k++) {
        int s = syms ? syms[k] : -1;
        if (s < 0 && dims[k] != t->shape[k]) {
            format_shape(want, sizeof want, t->shape, t->rank);
            return cuvil_fail(CUVIL_ERR_SHAPE, "input %s: shape %s does not match the model's %s (dim %d is fixed)",
                              t->name, have, want, k);
        }
        if (s >= 0 && (dims[k] < m->dims[s].min || dims[k] > m->dims[s].max))
            return cuvil_fail(CUVIL_ERR_SHAPE, "input %s: shape %s: dim %d (%s) = %lld is outside its bounds [%lld, %lld]",
                              t->name, have, k, m->dims[s].name, (long long)dims[k], (long long)m->dims[s].min,
                              (long long)m->dims[s].max);
    }
    if (m->n_dims == 0) return CUVIL_OK;
    for (k = 0; k < rank; k++) {
        ctx->given[off + k] = dims[k];
        if (syms[k] >= 0) ctx->values[syms[k]] = dims[k];
    }
    reset_produced(ctx);
    update_current(ctx);
    return CUVIL_OK;
}

/* Every input's shape as set agrees with the symbol values (the last input set wins a
 * disagreement, which is refused here). */
static cuvil_status check_given(const cuvil_ctx *ctx) {
    const cuvil_model_desc *m = ctx->model;
    int i, k, off = 0;
    for (i = 0; i < m->n_inputs; i++) {
        for (k = 0; k < m->inputs[i].rank; k++) {
            int s = m->input_dim_symbols[off + k];
            if (s >= 0 && ctx->given[off + k] != ctx->values[s])
                return cuvil_fail(CUVIL_ERR_SHAPE, "model %s: input %s has %s = %lld, but another input set %s = %lld",
                                  m->prefix, m->inputs[i].name, m->dims[s].name, (long long)ctx->given[off + k],
                                  m->dims[s].name, (long long)ctx->values[s]);
        }
        off += m->inputs[i].rank;
    }
    return CUVIL_OK;
}

cuvil_status cuvil_ctx_create(const cuvil_model_desc *model, cuvil_ctx **out) {
    cuvil_status st;
    cuvil_ctx *ctx;
    size_t bytes;
    if (out == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "cuvil_ctx_create: out is NULL");
    *out = NULL;
    if ((st = check_model(model)) != CUVIL_OK) return st;
    if (model->arena_size > (uint64_t)(SIZE_MAX - 2 * CUVIL_ARENA_ALIGN))
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, "model %s: arena of %llu bytes does not fit in memory", model->prefix,
                          (unsigned long long)model->arena_size);
    ctx = (cuvil_ctx *)calloc(1, sizeof *ctx);
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "model %s: cannot allocate a context", model->prefix);
    bytes = (size_t)model->arena_size + CUVIL_ARENA_ALIGN;
    ctx->block = malloc(bytes);
    if (ctx->block == NULL) {
        free(ctx);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "model %s: cannot allocate the %llu-byte arena", model->prefix,
                          (unsigned long long)model->arena_size);
    }
    ctx->arena = (uint8_t *)ctx->block +
                 (CUVIL_ARENA_ALIGN - (uintptr_t)ctx->block % CUVIL_ARENA_ALIGN) % CUVIL_ARENA_ALIGN;
    ctx->model = model;
    ctx->threads = 1;
    if (model->n_dims > 0 && (st = init_dims(ctx)) != CUVIL_OK) {
        cuvil_ctx_destroy(ctx);
        return st;
    }
    *out = ctx;
    return CUVIL_OK;
}

cuvil_status cuvil_ctx_destroy(cuvil_ctx *ctx) {
    if (ctx == NULL) return CUVIL_OK;
    free(ctx->given);
    free(ctx->shapes);
    free(ctx->current);
    free(ctx->block);
    free(ctx);
    return CUVIL_OK;
}

cuvil_status cuvil_ctx_set_threads(cuvil_ctx *ctx, int threads) {
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "set_threads: context is NULL");
    if (threads < 1) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "thread count must be at least 1, got %d", threads);
    if (__atomic_load_n(&ctx->running, __ATOMIC_ACQUIRE))
        return cuvil_fail(CUVIL_ERR_BUSY, "model %s: set_threads while the context is running on another thread; "
                          "use one context per thread", ctx->model->prefix);
    ctx->threads = threads > CUVIL_MAX_THREADS ? CUVIL_MAX_THREADS : threads;
    return CUVIL_OK;
}

static cuvil_status check_tensors(const cuvil_model_desc *model, const void *const *inputs, void *const *outputs) {
    int i;
    if (model->n_inputs > 0 && inputs == NULL)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s: inputs array is NULL", model->prefix);
    if (model->n_outputs > 0 && outputs == NULL)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s: outputs array is NULL", model->prefix);
    for (i = 0; i < model->n_inputs; i++)
        if (inputs[i] == NULL && model->inputs[i].nbytes > 0)
            return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s: input %d (%s) is NULL", model->prefix, i,
                              model->inputs[i].name);
    for (i = 0; i < model->n_outputs; i++)
        if (outputs[i] == NULL && model->outputs[i].nbytes > 0)
            return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s: output %d (%s) is NULL", model->prefix, i,
                              model->outputs[i].name);
    return CUVIL_OK;
}

/* The generated code reads inputs only; its signature predates const. A model with
 * symbolic dims gets their values (`values`; NULL: the upper bounds). */
static void call_forward(const cuvil_model_desc *model, const void *const *inputs, void *const *outputs,
                         uint8_t *arena, int64_t *values) {
    if (model->n_dims > 0) {
        int64_t max[CUVIL_MAX_DIMS];
        int i;
        for (i = 0; values == NULL && i < model->n_dims; i++) max[i] = model->dims[i].max;
        model->forward_dims((void **)(uintptr_t)inputs, (void **)(uintptr_t)outputs, arena, values ? values : max);
        return;
    }
    model->forward((void **)(uintptr_t)inputs, (void **)(uintptr_t)outputs, arena);
}

cuvil_status cuvil_ctx_run(cuvil_ctx *ctx, const void *const *inputs, void *const *outputs) {
    cuvil_status st;
    int saved;
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "run: context is NULL");
    if ((st = check_tensors(ctx->model, inputs, outputs)) != CUVIL_OK) return st;
    if (ctx->model->n_dims > 0 && (st = check_given(ctx)) != CUVIL_OK) return st;
    if (__atomic_exchange_n(&ctx->running, 1, __ATOMIC_ACQUIRE))
        return cuvil_fail(CUVIL_ERR_BUSY, "model %s: the context is running on another thread; use one context per "
                          "thread", ctx->model->prefix);
    saved = cuvil_get_num_threads();
    cuvil_set_num_threads(ctx->threads);
    if (ctx->produced) reset_produced(ctx);
    call_forward(ctx->model, inputs, outputs, ctx->arena, ctx->values);
    if (ctx->produced) update_current(ctx); /* the sizes the run produced */
    cuvil_set_num_threads(saved);
    __atomic_store_n(&ctx->running, 0, __ATOMIC_RELEASE);
    return CUVIL_OK;
}

cuvil_status cuvil_run_with_scratch(const cuvil_model_desc *model, void *scratch, size_t scratch_size,
                                    const void *const *inputs, void *const *outputs) {
    cuvil_status st;
    if ((st = check_model(model)) != CUVIL_OK) return st;
    if (model->arena_size > 0) {
        if (scratch == NULL)
            return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "model %s: scratch is NULL, the model needs %llu bytes",
                              model->prefix, (unsigned long long)model->arena_size);
        if ((uint64_t)scratch_size < model->arena_size)
            return cuvil_fail(CUVIL_ERR_SCRATCH_TOO_SMALL, "model %s: scratch holds %llu bytes, the model needs %llu",
                              model->prefix, (unsigned long long)scratch_size, (unsigned long long)model->arena_size);
        if ((uintptr_t)scratch % CUVIL_ARENA_ALIGN != 0)
            return cuvil_fail(CUVIL_ERR_SCRATCH_MISALIGNED, "model %s: scratch at %p is not %d-byte aligned",
                              model->prefix, scratch, CUVIL_ARENA_ALIGN);
    }
    if ((st = check_tensors(model, inputs, outputs)) != CUVIL_OK) return st;
    call_forward(model, inputs, outputs, (uint8_t *)scratch, NULL);
    return CUVIL_OK;
}
