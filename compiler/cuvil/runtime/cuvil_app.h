/* The standalone executable: what the generated glue hands to cuvil_main.c, and
 * the input/output helpers (.npy, images, JSON) main uses.
 *
 * Every loader checks each size it reads (npy header, image dimensions) against
 * the model's declared tensor and against overflow before allocating; failures
 * return a status and leave a one-line reason in cuvil_last_error().
 */
#ifndef CUVIL_APP_H
#define CUVIL_APP_H

#include <stdio.h>

#include "cuvil_plugin.h"
#include "cuvil_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUVIL_IMAGE_MAX_SIDE 16384
#define CUVIL_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#define CUVIL_IMAGE_MAX_FILE ((size_t)1 << 28)
#define CUVIL_NPY_MAX_HEADER 65536

typedef enum { CUVIL_PRE_NONE = 0, CUVIL_PRE_IMAGE = 1, CUVIL_PRE_PLUGIN = 2 } cuvil_pre_kind;

/* A plugin hook in use: the plugin and the options the config gave it. */
typedef struct cuvil_plugin_use {
    const cuvil_plugin *plugin; /* NULL: none */
    cuvil_plugin_options options;
} cuvil_plugin_use;
typedef enum { CUVIL_LAYOUT_NCHW = 0, CUVIL_LAYOUT_NHWC = 1 } cuvil_layout;
typedef enum { CUVIL_COLOR_RGB = 0, CUVIL_COLOR_BGR = 1, CUVIL_COLOR_GRAY = 2 } cuvil_color;

/* Image pre-processing of one f32 input of shape [1,C,H,W] / [C,H,W] (NCHW) or
 * [1,H,W,C] / [H,W,C] (NHWC): decode to RGB8, resize, centre-crop to H x W,
 * v * scale, (v - mean[c]) / std[c]. */
typedef struct cuvil_image_pre {
    cuvil_pre_kind kind;
    int resize_short; /* shorter side to this size (0: see resize_h/resize_w) */
    int resize_h, resize_w; /* exact size (0: no resize) */
    float scale;
    const float *mean; /* C values */
    const float *std; /* C values */
    cuvil_layout layout;
    cuvil_color color;
    cuvil_plugin_use plugin; /* kind CUVIL_PRE_PLUGIN: its preprocess hook fills the input */
} cuvil_image_pre;

typedef enum { CUVIL_POST_NONE = 0, CUVIL_POST_CLASSIFICATION = 1 } cuvil_post_kind;

typedef struct cuvil_post {
    cuvil_post_kind kind;
    int top_k;
    int softmax;
    int n_labels; /* 0 or the number of classes */
    const char *const *labels;
} cuvil_post;

typedef struct cuvil_app {
    const cuvil_model_desc *model;
    const cuvil_image_pre *pre; /* one per input */
    const cuvil_post *post; /* one per output */
    cuvil_plugin_use postprocess; /* a plugin writing --output from all outputs (or none) */
    int n_plugins;
    const cuvil_plugin *const *plugins; /* every plugin module linked in (checked at start) */
    int default_threads; /* --threads when not given: the config's optimize.threads (0 means 1) */
} cuvil_app;

/* Defined by the generated glue of each executable. */
extern const cuvil_app cuvil_main_app;

/* .npy: read `path` into `dst` (t->nbytes) if its header matches `t` exactly. */
cuvil_status cuvil_npy_load(const char *path, const cuvil_tensor_desc *t, void *dst);
/* The shape in a .npy file's header (at most CUVIL_MAX_RANK dims). */
cuvil_status cuvil_npy_shape(const char *path, int64_t *dims, int *rank);
/* .npy version 1.0 of `t` to `f`. */
cuvil_status cuvil_npy_write(FILE *f, const cuvil_tensor_desc *t, const void *data);

/* Decode a JPEG or PNG held in memory and pre-process it into `dst` (t->count floats). */
cuvil_status cuvil_image_load(const uint8_t *data, size_t size, const cuvil_image_pre *pre,
                              const cuvil_tensor_desc *t, float *dst);
/* Resize, crop and normalise an RGB8 image (exposed for tests). */
cuvil_status cuvil_image_preprocess(const uint8_t *rgb, int width, int height, const cuvil_image_pre *pre,
                                    const cuvil_tensor_desc *t, float *dst);

/* `s` with bytes outside printable ASCII written as \xNN (for messages: one line, valid text). */
const char *cuvil_printable(const char *s, char *buf, size_t cap);
/* Read a whole regular file of at most `max_size` bytes. */
cuvil_status cuvil_read_file(const char *path, size_t max_size, uint8_t **data, size_t *size);
/* Open `path` for reading after checking it is a regular file (not a directory). */
cuvil_status cuvil_open_input(const char *path, FILE **out);
/* Write `path` atomically: `write` fills a temporary file next to it
 * (`.cuvil-PID-RAND.tmp`, removed on SIGINT, SIGTERM or SIGHUP; a killed process's
 * is removed by the next write in that directory), which is renamed over `path`
 * only if everything succeeded. */
cuvil_status cuvil_write_atomic(const char *path, cuvil_status (*write)(FILE *f, void *arg), void *arg);

/* JSON of the outputs: top-k (+ logits) for classification outputs, else data. */
cuvil_status cuvil_json_write(FILE *f, const cuvil_app *app, void *const *outputs, int with_logits);

#ifdef __cplusplus
}
#endif

#endif /* CUVIL_APP_H */
