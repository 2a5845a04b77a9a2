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
    if (model->forward == NULL || model->n_inputs < 0 || model->n_outputs < 0)
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
    *out = ctx;
    return CUVIL_OK;
}

cuvil_status cuvil_ctx_destroy(cuvil_ctx *ctx) {
    if (ctx == NULL) return CUVIL_OK;
    free(ctx->block);
    free(ctx);
    return CUVIL_OK;
}

cuvil_status cuvil_ctx_set_threads(cuvil_ctx *ctx, int threads) {
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "set_threads: context is NULL");
    if (threads < 1) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "thread count must be at least 1, got %d", threads);
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

/* The generated code reads inputs only; its signature predates const. */
static void call_forward(const cuvil_model_desc *model, const void *const *inputs, void *const *outputs,
                         uint8_t *arena) {
    model->forward((void **)(uintptr_t)inputs, (void **)(uintptr_t)outputs, arena);
}

cuvil_status cuvil_ctx_run(cuvil_ctx *ctx, const void *const *inputs, void *const *outputs) {
    cuvil_status st;
    int saved;
    if (ctx == NULL) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "run: context is NULL");
    if ((st = check_tensors(ctx->model, inputs, outputs)) != CUVIL_OK) return st;
    if (__atomic_exchange_n(&ctx->running, 1, __ATOMIC_ACQUIRE))
        return cuvil_fail(CUVIL_ERR_BUSY, "model %s: the context is running on another thread; use one context per "
                          "thread", ctx->model->prefix);
    saved = cuvil_get_num_threads();
    cuvil_set_num_threads(ctx->threads);
    call_forward(ctx->model, inputs, outputs, ctx->arena);
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
    call_forward(model, inputs, outputs, (uint8_t *)scratch);
    return CUVIL_OK;
}
