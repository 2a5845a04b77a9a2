/* Cuvil plugins: C modules linked into a model's executable at the link stage.
 *
 * A plugin module defines one descriptor with CUVIL_PLUGIN, naming the hooks it
 * provides (any of them may be left out):
 *
 *     #include "cuvil_plugin.h"
 *     static cuvil_status my_pre(void *state, const uint8_t *data, size_t size,
 *                                const cuvil_tensor_desc *t, void *dst) { ... }
 *     CUVIL_PLUGIN(my_image, .preprocess = my_pre);
 *
 * and the build config says where each hook is used (`plugin.modules` lists the
 * C files; an input's `preprocess: {kind: plugin, plugin: my_image}`;
 * `plugin.postprocess: {plugin: NAME}`; `plugin.custom_ops` binds a model op to
 * a C function). The executable calls them in order: each input's pre-processor
 * (raw file bytes -> that input tensor), the model (custom ops run inside it),
 * then the post-processor (all output tensors -> the bytes of --output).
 *
 * Versioning. CUVIL_PLUGIN_ABI_VERSION changes whenever anything in this file
 * changes incompatibly. CUVIL_PLUGIN records it, the Cuvil ABI version and the
 * target triple the module was compiled for, as a signature string in the
 * module's object file: the link stage refuses a module built for another target
 * or ABI version (naming both sides), and the executable checks the descriptor
 * again before it calls any hook.
 *
 * Threads: hooks run on the thread that called main; a custom op may call
 * cuvil_parallel_for (it runs on the model's thread count). WASI is single-threaded.
 */
#ifndef CUVIL_PLUGIN_H
#define CUVIL_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cuvil_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUVIL_PLUGIN_ABI_VERSION 1

/* Options from the config (`options: {key: value}`), as strings, in key order. */
typedef struct cuvil_plugin_options {
    int count;
    const char *const *keys;
    const char *const *values;
} cuvil_plugin_options;

/* Where a post-processor writes its output (the --output file). */
typedef struct cuvil_writer {
    cuvil_status (*write)(void *self, const void *data, size_t size);
    void *self;
} cuvil_writer;

/* One operand or the result of a custom op: a contiguous row-major tensor. */
typedef struct cuvil_op_tensor {
    void *data;
    int32_t dtype; /* a cuvil_dtype */
    int32_t rank;
    const int64_t *shape; /* `rank` dims */
    int64_t count; /* elements */
} cuvil_op_tensor;

/* A custom op: the IR op `cuvil.custom {symbol = "NAME"}` calls the C function NAME
 * with this signature. `out` is preallocated with the shape the model declared;
 * `params` are the op's scalar arguments (e.g. an activation's slope). A custom op
 * cannot fail: check what you need in the plugin's `init`. */
typedef void (*cuvil_custom_op_fn)(const cuvil_op_tensor *out, const cuvil_op_tensor *ins, int32_t n_ins,
                                   const double *params, int32_t n_params);

typedef struct cuvil_plugin {
    uint32_t abi_version; /* CUVIL_PLUGIN_ABI_VERSION when the module was compiled */
    uint32_t size; /* sizeof(cuvil_plugin) when the module was compiled */
    const char *name;
    const char *signature; /* CUVIL_PLUGIN_SIGNATURE(name) */
    /* Called once per use (an input it pre-processes, the post-processing) before
     * any other hook; *state is handed to the hooks of that use. May be NULL. */
    cuvil_status (*init)(void **state, const cuvil_plugin_options *options);
    void (*destroy)(void *state); /* may be NULL */
    /* Raw input bytes (the whole --input file) -> the input tensor `t` at `dst`
     * (t->nbytes bytes, 64-byte aligned). On failure return a status from
     * cuvil_fail(...), whose message the executable prints. */
    cuvil_status (*preprocess)(void *state, const uint8_t *data, size_t size, const cuvil_tensor_desc *t, void *dst);
    /* Every output tensor of the model (manifest order) -> bytes written to `out`. */
    cuvil_status (*postprocess)(void *state, int n_outputs, const cuvil_tensor_desc *outputs,
                                const void *const *data, const cuvil_writer *out);
} cuvil_plugin;

#define CUVIL_PLUGIN_SIGNATURE(id)                                                                             \
    CUVIL_SIGNATURE_MAGIC "kind=plugin;name=" #id ";abi=" CUVIL_STR(CUVIL_ABI_VERSION) ";plugin_abi="          \
        CUVIL_STR(CUVIL_PLUGIN_ABI_VERSION) ";runtime=" CUVIL_RUNTIME_VERSION ";triple=" CUVIL_TARGET_TRIPLE

/* Define the module's descriptor `cuvil_plugin_<id>` with designated initializers
 * for the hooks: CUVIL_PLUGIN(id, .init = f, .preprocess = g). A module that only
 * defines custom op functions still declares CUVIL_PLUGIN(id): its signature is
 * what the link stage checks. */
#define CUVIL_PLUGIN(id, ...)                                                                                   \
    const cuvil_plugin cuvil_plugin_##id = {.abi_version = CUVIL_PLUGIN_ABI_VERSION,                            \
                                            .size = (uint32_t)sizeof(cuvil_plugin),                             \
                                            .name = #id,                                                        \
                                            .signature = CUVIL_PLUGIN_SIGNATURE(id),                            \
                                            __VA_ARGS__}

/* The value of option `key`, or `fallback` when the config does not give it. */
static inline const char *cuvil_option(const cuvil_plugin_options *o, const char *key, const char *fallback) {
    int i, k;
    if (o == NULL) return fallback;
    for (i = 0; i < o->count; i++) {
        for (k = 0; key[k] && key[k] == o->keys[i][k]; k++) {}
        if (key[k] == '\0' && o->keys[i][k] == '\0') return o->values[i];
    }
    return fallback;
}

/* printf into a writer. */
static inline cuvil_status cuvil_writef(const cuvil_writer *w, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline cuvil_status cuvil_writef(const cuvil_writer *w, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "cuvil_writef: bad format");
    if ((size_t)n >= sizeof buf) return cuvil_fail(CUVIL_ERR_TOO_LARGE, "cuvil_writef: more than %d bytes at once",
                                                   (int)sizeof buf - 1);
    return w->write(w->self, buf, (size_t)n);
}

#ifdef __cplusplus
}
#endif

#endif /* CUVIL_PLUGIN_H */
