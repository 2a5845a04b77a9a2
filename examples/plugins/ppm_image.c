/* A pre-processing plugin: a binary PPM (P6) or PGM (P5) image -> an f32 image input.
 *
 * It needs no image library, so it works on every target (aarch64 and wasm32
 * executables are linked without libjpeg/libpng). The image is resized to the
 * input's H x W with bilinear interpolation (half-pixel centres, edges clamped:
 * torch's F.interpolate(mode="bilinear", align_corners=False)), then each value
 * becomes (v * scale - mean[c]) / std[c].
 *
 * Options (config: inputs[i].preprocess.options):
 *   scale   default 1/255
 *   mean    "m" or "m0,m1,m2", default 0
 *   std     "s" or "s0,s1,s2", default 1
 *   layout  NCHW (default) or NHWC
 *
 * Input shapes: [1, C, H, W] / [C, H, W] (NCHW) or [1, H, W, C] / [H, W, C] (NHWC),
 * C = 3 (grey images are repeated) or 1 (colour images are averaged).
 */
#include <stdlib.h>
#include <string.h>

#include "cuvil_plugin.h"

#define PPM_MAX_SIDE 16384

typedef struct {
    float scale, mean[3], std[3];
    int nhwc;
} ppm_settings;

static int parse_floats(const char *text, float *out, int n) {
    char *end;
    int k = 0;
    while (k < n) {
        out[k++] = strtof(text, &end);
        if (end == text) return 0;
        if (*end == '\0') break;
        if (*end != ',') return 0;
        text = end + 1;
    }
    if (k == 1)
        for (; k < n; k++) out[k] = out[0];
    return k == n;
}

static cuvil_status ppm_init(void **state, const cuvil_plugin_options *options) {
    ppm_settings *s = (ppm_settings *)calloc(1, sizeof *s);
    const char *layout = cuvil_option(options, "layout", "NCHW");
    if (s == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "ppm_image: out of memory");
    *state = s;
    if (!parse_floats(cuvil_option(options, "scale", "0.00392156862745098"), &s->scale, 1) ||
        !parse_floats(cuvil_option(options, "mean", "0"), s->mean, 3) ||
        !parse_floats(cuvil_option(options, "std", "1"), s->std, 3))
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "ppm_image: scale, mean and std must be numbers (1 or 3, "
                          "comma-separated)");
    if (s->std[0] == 0.0f || s->std[1] == 0.0f || s->std[2] == 0.0f)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "ppm_image: std must not be 0");
    if (strcmp(layout, "NCHW") != 0 && strcmp(layout, "NHWC") != 0)
        return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "ppm_image: layout must be NCHW or NHWC, got '%s'", layout);
    s->nhwc = strcmp(layout, "NHWC") == 0;
    return CUVIL_OK;
}

static void ppm_destroy(void *state) { free(state); }

/* The next header number after whitespace and # comments; -1 when malformed. */
static long header_number(const uint8_t *d, size_t size, size_t *pos) {
    long v = 0;
    int digits = 0;
    for (;;) {
        while (*pos < size && (d[*pos] == ' ' || d[*pos] == '\t' || d[*pos] == '\n' || d[*pos] == '\r')) ++*pos;
        if (*pos < size && d[*pos] == '#') {
            while (*pos < size && d[*pos] != '\n') ++*pos;
            continue;
        }
        break;
    }
    while (*pos < size && d[*pos] >= '0' && d[*pos] <= '9') {
        if (v > 1000000) return -1;
        v = v * 10 + (d[(*pos)++] - '0');
        digits++;
    }
    return digits ? v : -1;
}

/* Sample position and weights of output index i along an axis of in -> out. */
static void bilinear(int i, int in, int out, int *i0, int *i1, float *w1) {
    float x = ((float)i + 0.5f) * (float)in / (float)out - 0.5f;
    int lo;
    if (x < 0.0f) x = 0.0f;
    lo = (int)x;
    if (lo > in - 1) lo = in - 1;
    *i0 = lo;
    *i1 = lo + 1 < in ? lo + 1 : in - 1;
    *w1 = x - (float)lo;
}

static cuvil_status ppm_preprocess(void *state, const uint8_t *data, size_t size, const cuvil_tensor_desc *t,
                                   void *dst) {
    const ppm_settings *s = (const ppm_settings *)state;
    size_t pos = 2;
    long width, height, maxval;
    int channels, c, h, w, y, x, k, r = t->rank;
    const uint8_t *pixels;
    float *out = (float *)dst;
    if (size < 2 || data[0] != 'P' || (data[1] != '6' && data[1] != '5'))
        return cuvil_fail(CUVIL_ERR_FORMAT, "ppm_image: not a binary PPM (P6) or PGM (P5) file");
    channels = data[1] == '6' ? 3 : 1;
    width = header_number(data, size, &pos);
    height = header_number(data, size, &pos);
    maxval = header_number(data, size, &pos);
    if (width < 1 || height < 1 || maxval < 1 || maxval > 255 || pos >= size)
        return cuvil_fail(CUVIL_ERR_FORMAT, "ppm_image: malformed header (8-bit images only)");
    if (width > PPM_MAX_SIDE || height > PPM_MAX_SIDE)
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, "ppm_image: %ldx%ld exceeds %d per side", width, height, PPM_MAX_SIDE);
    pos++; /* the single whitespace after maxval */
    if ((uint64_t)(size - pos) < (uint64_t)width * (uint64_t)height * (uint64_t)channels)
        return cuvil_fail(CUVIL_ERR_FORMAT, "ppm_image: truncated: %ldx%ld needs %llu bytes of pixels", width, height,
                          (unsigned long long)width * (unsigned long long)height * (unsigned long long)channels);
    pixels = data + pos;
    if (t->dtype != CUVIL_F32 || r < 3 || r > 4 || (r == 4 && t->shape[0] != 1))
        return cuvil_fail(CUVIL_ERR_SHAPE, "ppm_image: input '%s' must be f32 [1,C,H,W] or [C,H,W] (or NHWC)",
                          t->name);
    c = (int)(s->nhwc ? t->shape[r - 1] : t->shape[r - 3]);
    h = (int)(s->nhwc ? t->shape[r - 3] : t->shape[r - 2]);
    w = (int)(s->nhwc ? t->shape[r - 2] : t->shape[r - 1]);
    if (c != 1 && c != 3) return cuvil_fail(CUVIL_ERR_SHAPE, "ppm_image: input '%s' has %d channels", t->name, c);
    for (y = 0; y < h; y++) {
        int y0, y1, x0, x1;
        float wy, wx;
        bilinear(y, (int)height, h, &y0, &y1, &wy);
        for (x = 0; x < w; x++) {
            float v[3];
            bilinear(x, (int)width, w, &x0, &x1, &wx);
            for (k = 0; k < channels; k++) {
                float a = pixels[((size_t)y0 * width + x0) * channels + k];
                float b = pixels[((size_t)y0 * width + x1) * channels + k];
                float cc = pixels[((size_t)y1 * width + x0) * channels + k];
                float d = pixels[((size_t)y1 * width + x1) * channels + k];
                float top = a + (b - a) * wx, bottom = cc + (d - cc) * wx;
                v[k] = (top + (bottom - top) * wy) * 255.0f / (float)maxval;
            }
            if (channels == 1) v[1] = v[2] = v[0];
            if (c == 1) v[0] = (v[0] + v[1] + v[2]) / 3.0f;
            for (k = 0; k < c; k++) {
                float val = (v[k] * s->scale - s->mean[k]) / s->std[k];
                if (s->nhwc) out[((size_t)y * w + x) * c + k] = val;
                else out[((size_t)k * h + y) * w + x] = val;
            }
        }
    }
    return CUVIL_OK;
}

CUVIL_PLUGIN(ppm_image, .init = ppm_init, .destroy = ppm_destroy, .preprocess = ppm_preprocess);
