/* Cuvil runtime: tensors, the arena, the thread pool, error codes and messages.
 *
 * C99 with libc, libm and pthreads only (GCC/Clang: `__thread` and `__atomic`
 * builtins). A generated `<prefix>.h` describes one model with the structs below
 * and wraps the generic functions in a prefixed API (`<prefix>_create`, ...).
 *
 * Contexts: one per thread. A context owns a 64-byte aligned arena of the
 * model's arena size; the weights are read-only and shared by all contexts.
 * Running one context from two threads at once, or setting its shapes or threads
 * while it runs, is refused (CUVIL_ERR_BUSY).
 */
#ifndef CUVIL_RUNTIME_H
#define CUVIL_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define CUVIL_EXPORT __attribute__((visibility("default")))
#define CUVIL_WEAK __attribute__((weak))
#else
#define CUVIL_EXPORT
#define CUVIL_WEAK
#endif

/* The ABI between generated model objects, this runtime and plugins. Version 2
 * added the signature (below) to cuvil_model_desc; version 3 the symbolic dims. */
#define CUVIL_ABI_VERSION 3
/* The version of these runtime sources (cuvil.runtime.RUNTIME_VERSION). */
#define CUVIL_RUNTIME_VERSION "0.2.0"
#define CUVIL_ARENA_ALIGN 64
#define CUVIL_MAX_RANK 8
#define CUVIL_MAX_THREADS 256
#define CUVIL_MAX_DIMS 16 /* symbolic dims of one model */

/* Every function that can fail returns one of these; 0 is success. */
/* The target this file is compiled for, as an LLVM triple (what the compiler's
 * manifest and signatures record). */
#if defined(__x86_64__) && defined(__linux__)
#define CUVIL_TARGET_TRIPLE "x86_64-unknown-linux-gnu"
#elif defined(__aarch64__) && defined(__linux__)
#define CUVIL_TARGET_TRIPLE "aarch64-unknown-linux-gnu"
#elif defined(__wasm32__) && defined(__wasi__)
#define CUVIL_TARGET_TRIPLE "wasm32-unknown-wasi"
#else
#define CUVIL_TARGET_TRIPLE "unsupported"
#endif

#define CUVIL_STR_(x) #x
#define CUVIL_STR(x) CUVIL_STR_(x)
/* ABI signatures are strings in the objects' read-only data, found by the link
 * stage (cuvil.native) and compared at run time: "CUVIL-SIGNATURE:" then
 * `;`-separated key=value pairs: kind (model | runtime | plugin), name, abi,
 * runtime, triple and, for plugins, plugin_abi. */
#define CUVIL_SIGNATURE_MAGIC "CUVIL-SIGNATURE:"
#define CUVIL_RUNTIME_SIGNATURE                                                                         \
    CUVIL_SIGNATURE_MAGIC "kind=runtime;name=cuvil;abi=" CUVIL_STR(CUVIL_ABI_VERSION) ";runtime=" \
        CUVIL_RUNTIME_VERSION ";triple=" CUVIL_TARGET_TRIPLE

typedef enum cuvil_status {
    CUVIL_OK = 0,
    CUVIL_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, index out of range, bad count */
    CUVIL_ERR_OUT_OF_MEMORY = 2,
    CUVIL_ERR_SCRATCH_TOO_SMALL = 3, /* run_with_scratch: fewer bytes than ARENA_SIZE */
    CUVIL_ERR_SCRATCH_MISALIGNED = 4, /* run_with_scratch: not 64-byte aligned */
    CUVIL_ERR_BUSY = 5, /* the context is running on another thread */
    CUVIL_ERR_IO = 6, /* a file could not be opened, read or written */
    CUVIL_ERR_FORMAT = 7, /* a malformed or truncated input file */
    CUVIL_ERR_SHAPE = 8, /* a tensor's shape differs from the model's */
    CUVIL_ERR_DTYPE = 9, /* a tensor's dtype differs from the model's */
    CUVIL_ERR_UNSUPPORTED = 10, /* valid input the runtime does not handle */
    CUVIL_ERR_TOO_LARGE = 11, /* a size overflows or exceeds a limit */
    CUVIL_ERR_ABI = 12 /* a model or plugin built for another target or ABI version */
} cuvil_status;

typedef enum cuvil_dtype {
    CUVIL_DTYPE_INVALID = 0,
    CUVIL_F32 = 1,
    CUVIL_F16 = 2,
    CUVIL_F64 = 3,
    CUVIL_I64 = 4,
    CUVIL_I32 = 5,
    CUVIL_I8 = 6,
    CUVIL_U8 = 7,
    CUVIL_BOOL = 8
} cuvil_dtype;

/* One input or output of a model: a contiguous row-major tensor. With symbolic dims the
 * model's descriptors give the shapes at the upper bounds (so count and nbytes size
 * buffers for every run); cuvil_ctx_tensor() gives a context's current ones. */
typedef struct cuvil_tensor_desc {
    const char *name;
    cuvil_dtype dtype;
    int rank;
    const int64_t *shape; /* `rank` dims; NULL for rank 0 */
    int64_t count; /* number of elements */
    uint64_t nbytes; /* count * element size */
} cuvil_tensor_desc;

/* The generated forward function: pointers to the tensors in manifest order and
 * the arena (`arena_size` bytes, 64-byte aligned, private to this run). */
typedef void (*cuvil_forward_fn)(void **inputs, void **outputs, uint8_t *arena);
/* The forward function of a model with symbolic dims: `dims` holds their values; the
 * run stores the dims it produces (data-dependent sizes) into it. */
typedef void (*cuvil_forward_dims_fn)(void **inputs, void **outputs, uint8_t *arena, int64_t *dims);
/* Every input's, then every output's dims (concatenated) for the given symbol values. */
typedef void (*cuvil_shapes_fn)(const int64_t *dims, int64_t *shapes);

/* A symbolic dim (batch, seq_len) and its bounds: a run may use any value in [min, max]. */
typedef struct cuvil_dim_desc {
    const char *name;
    int64_t min, max;
} cuvil_dim_desc;

typedef struct cuvil_model_desc {
    int abi_version; /* CUVIL_ABI_VERSION */
    const char *prefix;
    uint64_t arena_size;
    int n_inputs;
    const cuvil_tensor_desc *inputs;
    int n_outputs;
    const cuvil_tensor_desc *outputs;
    cuvil_forward_fn forward;
    /* The model object's signature (`<prefix>_signature`, see CUVIL_SIGNATURE_MAGIC):
     * checked against this runtime's when a context is created. NULL: not checked. */
    const char *signature;
    /* Symbolic dims (ABI 3); n_dims == 0 for a model with static shapes, which uses
     * `forward`; one with symbolic dims uses `forward_dims` (and `forward` is NULL). */
    int n_dims;
    const cuvil_dim_desc *dims;
    const int32_t *input_dim_symbols; /* per input, per dim (flattened): index into dims, or -1 */
    cuvil_forward_dims_fn forward_dims;
    cuvil_shapes_fn shapes;
} cuvil_model_desc;

typedef struct cuvil_ctx cuvil_ctx;

/* --- errors ---------------------------------------------------------------- */

/* A fixed sentence for a status code ("ok", "out of memory", ...). Never NULL. */
CUVIL_EXPORT const char *cuvil_status_message(cuvil_status status);
/* The detailed message of the last failure on the calling thread ("" if none). */
CUVIL_EXPORT const char *cuvil_last_error(void);
/* Record a detailed message for the calling thread and return `status`. */
cuvil_status cuvil_fail(cuvil_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* This runtime's signature (CUVIL_RUNTIME_SIGNATURE). */
CUVIL_EXPORT const char *cuvil_runtime_signature(void);
/* CUVIL_OK if `signature` (a model's or plugin's) is for this runtime's target and
 * ABI; otherwise CUVIL_ERR_ABI with a message naming both sides. `what` names the
 * other side in the message ("model mobilenet_v2"). */
CUVIL_EXPORT cuvil_status cuvil_check_signature(const char *what, const char *signature);

/* --- dtypes ---------------------------------------------------------------- */

CUVIL_EXPORT size_t cuvil_dtype_size(cuvil_dtype dtype); /* 0 for an invalid dtype */
CUVIL_EXPORT const char *cuvil_dtype_name(cuvil_dtype dtype); /* "f32", ...; "invalid" */

/* --- contexts (the generated prefixed API wraps these) -------------------- */

CUVIL_EXPORT cuvil_status cuvil_ctx_create(const cuvil_model_desc *model, cuvil_ctx **out);
CUVIL_EXPORT cuvil_status cuvil_ctx_destroy(cuvil_ctx *ctx); /* NULL is allowed */
/* Threads used by this context's runs (1..CUVIL_MAX_THREADS; larger is clamped). */
CUVIL_EXPORT cuvil_status cuvil_ctx_set_threads(cuvil_ctx *ctx, int threads);
CUVIL_EXPORT cuvil_status cuvil_ctx_run(cuvil_ctx *ctx, const void *const *inputs, void *const *outputs);
/* The shape of input `i` for the context's next runs (a model with symbolic dims
 * starts at the upper bounds). Static dims must match; a symbolic dim must lie in its
 * bounds and agree with the other inputs (checked by the run). CUVIL_ERR_SHAPE otherwise. */
CUVIL_EXPORT cuvil_status cuvil_ctx_set_input_shape(cuvil_ctx *ctx, int i, const int64_t *dims, int rank);
/* The context's current descriptor of input (is_output = 0) or output `i`: its shape,
 * count and nbytes for the input shapes set last. NULL for an index out of range. */
CUVIL_EXPORT const cuvil_tensor_desc *cuvil_ctx_tensor(const cuvil_ctx *ctx, int is_output, int i);
/* A run in caller-owned memory: `scratch` is 64-byte aligned and holds at least
 * the model's arena size (NULL is allowed when that is 0). Uses the calling
 * thread's thread count (cuvil_set_num_threads). A model with symbolic dims runs
 * at their upper bounds here (the shapes of its descriptors); use a context for others. */
CUVIL_EXPORT cuvil_status cuvil_run_with_scratch(const cuvil_model_desc *model, void *scratch, size_t scratch_size,
                                                 const void *const *inputs, void *const *outputs);

/* Metadata helpers: the tensor `i` of a model's inputs (is_output = 0) or outputs. */
CUVIL_EXPORT const cuvil_tensor_desc *cuvil_model_tensor(const cuvil_model_desc *model, int is_output, int i);
CUVIL_EXPORT cuvil_status cuvil_tensor_shape(const cuvil_tensor_desc *t, int64_t *dims, int max_dims);

/* --- thread pool (called by generated code) -------------------------------- */

/* Run fn over disjoint contiguous chunks covering [0, n) on up to the calling
 * thread's thread count, the caller included; returns when all are done. A call
 * from inside a task, or while the pool serves another caller, runs serially. */
CUVIL_EXPORT void cuvil_parallel_for(void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx, int64_t n);
/* The thread count of the calling thread (default 1). */
CUVIL_EXPORT void cuvil_set_num_threads(int n);
CUVIL_EXPORT int cuvil_get_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif /* CUVIL_RUNTIME_H */
