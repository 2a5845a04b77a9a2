/* Image inputs: JPEG (libjpeg-turbo) and PNG (libpng) decoding to RGB8, then the
 * model's pre-processing: resize, centre crop, scale, normalise, layout.
 *
 * Decoding is strict: libjpeg's corrupt-data warnings (a truncated file, a bad
 * marker) are errors, and so is any libpng error; dimensions are checked against
 * CUVIL_IMAGE_MAX_SIDE / CUVIL_IMAGE_MAX_PIXELS before the pixels are allocated.
 * Alpha is dropped; grey and palette images are expanded to RGB.
 *
 * Resize: a separable triangle (bilinear) filter whose support widens with the
 * downscale factor, as PIL's BILINEAR resize does (so it antialiases when
 * shrinking and is plain half-pixel bilinear with edge clamping when
 * enlarging). It runs in float throughout, with no rounding to 8 bits between the
 * passes, and only for the pixels inside the crop window. "Shorter side to S"
 * makes the longer side floor(S * long / short), and the crop offset is
 * round-half-to-even((resized - crop) / 2), both as torchvision computes them.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_app.h"

#ifndef CUVIL_NO_CODECS
#include <setjmp.h> /* the codecs' error exits; on wasm32, runtime/wasm32/setjmp.h */
#include <jpeglib.h>
#include <png.h>
#endif

typedef struct {
    uint8_t *pixels;
    int width, height;
} rgb_image;

#ifndef CUVIL_NO_CODECS

static cuvil_status check_dims(const char *what, int64_t w, int64_t h) {
    if (w <= 0 || h <= 0) return cuvil_fail(CUVIL_ERR_FORMAT, "%s image has no pixels (%lldx%lld)", what, (long long)w,
                                            (long long)h);
    if (w > CUVIL_IMAGE_MAX_SIDE || h > CUVIL_IMAGE_MAX_SIDE || w * h > CUVIL_IMAGE_MAX_PIXELS)
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, "%s image of %lldx%lld pixels exceeds the limit (%d per side, %lld "
                          "pixels)", what, (long long)w, (long long)h, CUVIL_IMAGE_MAX_SIDE,
                          (long long)CUVIL_IMAGE_MAX_PIXELS);
    return CUVIL_OK;
}

/* --- JPEG ------------------------------------------------------------------ */

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} jpeg_failure;

static void jpeg_fail(j_common_ptr cinfo) {
    jpeg_failure *err = (jpeg_failure *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void jpeg_warn(j_common_ptr cinfo, int level) {
    if (level < 0) jpeg_fail(cinfo); /* corrupt data: refuse rather than guess pixels */
}

static cuvil_status decode_jpeg(const uint8_t *data, size_t size, rgb_image *img) {
    struct jpeg_decompress_struct cinfo;
    jpeg_failure err;
    cuvil_status st;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    err.mgr.emit_message = jpeg_warn;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(img->pixels);
        img->pixels = NULL;
        return cuvil_fail(CUVIL_ERR_FORMAT, "corrupt JPEG: %s", err.message);
    }
    jpeg_create_decompress(&cinfo);
    cinfo.mem->max_memory_to_use = 1L << 30;
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
        jpeg_destroy_decompress(&cinfo);
        return cuvil_fail(CUVIL_ERR_FORMAT, "corrupt JPEG: no image in the file");
    }
    if ((st = check_dims("JPEG", cinfo.image_width, cinfo.image_height)) != CUVIL_OK) {
        jpeg_destroy_decompress(&cinfo);
        return st;
    }
    if (cinfo.num_components != 1 && cinfo.num_components != 3) {
        jpeg_destroy_decompress(&cinfo);
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "JPEG with %d colour components (CMYK?) is not supported",
                          cinfo.num_components);
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 || cinfo.output_width != cinfo.image_width ||
        cinfo.output_height != cinfo.image_height) {
        jpeg_destroy_decompress(&cinfo);
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "JPEG did not decode to RGB");
    }
    img->width = (int)cinfo.output_width;
    img->height = (int)cinfo.output_height;
    img->pixels = (uint8_t *)malloc((size_t)img->width * (size_t)img->height * 3);
    if (img->pixels == NULL) {
        jpeg_destroy_decompress(&cinfo);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate a %dx%d image", img->width, img->height);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = img->pixels + (size_t)cinfo.output_scanline * (size_t)img->width * 3;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
            jpeg_destroy_decompress(&cinfo);
            free(img->pixels);
            img->pixels = NULL;
            return cuvil_fail(CUVIL_ERR_FORMAT, "corrupt JPEG: truncated image data");
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return CUVIL_OK;
}

/* --- PNG ------------------------------------------------------------------- */

typedef struct {
    const uint8_t *data;
    size_t size, pos;
    char message[200], warning[200]; /* the error, and the first warning before it */
    png_bytep *rows;
} png_source;

static void png_fail(png_structp png, png_const_charp msg) {
    png_source *src = (png_source *)png_get_error_ptr(png);
    snprintf(src->message, sizeof src->message, "%s", msg);
    png_longjmp(png, 1);
}

static void png_warn(png_structp png, png_const_charp msg) {
    png_source *src = (png_source *)png_get_error_ptr(png);
    if (src->warning[0] == '\0') snprintf(src->warning, sizeof src->warning, "%s", msg);
}

static void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
    png_source *src = (png_source *)png_get_io_ptr(png);
    if (n > src->size - src->pos) png_error(png, "truncated file");
    memcpy(out, src->data + src->pos, n);
    src->pos += n;
}

static cuvil_status decode_png(const uint8_t *data, size_t size, rgb_image *img) {
    png_source src;
    png_structp png;
    png_infop info = NULL;
    png_uint_32 w, h;
    int depth, color, i;
    cuvil_status st;
    memset(&src, 0, sizeof src);
    src.data = data;
    src.size = size;
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_warn);
    if (png == NULL || (info = png_create_info_struct(png)) == NULL) {
        png_destroy_read_struct(&png, NULL, NULL);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot start the PNG decoder");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(src.rows);
        free(img->pixels);
        img->pixels = NULL;
        if (src.warning[0]) return cuvil_fail(CUVIL_ERR_FORMAT, "corrupt PNG: %s (%s)", src.message, src.warning);
        return cuvil_fail(CUVIL_ERR_FORMAT, "corrupt PNG: %s", src.message);
    }
    png_set_read_fn(png, &src, png_read_memory);
    png_set_user_limits(png, CUVIL_IMAGE_MAX_SIDE, CUVIL_IMAGE_MAX_SIDE);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)64 << 20);
    png_read_info(png, info);
    png_get_IHDR(png, info, &w, &h, &depth, &color, NULL, NULL, NULL);
    if ((st = check_dims("PNG", w, h)) != CUVIL_OK) {
        png_destroy_read_struct(&png, &info, NULL);
        return st;
    }
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) {
        png_destroy_read_struct(&png, &info, NULL);
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "PNG did not decode to 8-bit RGB");
    }
    img->width = (int)w;
    img->height = (int)h;
    img->pixels = (uint8_t *)malloc((size_t)w * h * 3);
    src.rows = (png_bytep *)malloc((size_t)h * sizeof(png_bytep));
    if (img->pixels == NULL || src.rows == NULL) png_error(png, "out of memory");
    for (i = 0; i < (int)h; i++) src.rows[i] = img->pixels + (size_t)i * w * 3;
    png_read_image(png, src.rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(src.rows);
    return CUVIL_OK;
}

#else /* CUVIL_NO_CODECS: an executable without image inputs, or a Bazel wasm32 one */

static cuvil_status decode_jpeg(const uint8_t *data, size_t size, rgb_image *img) {
    (void)data, (void)size, (void)img;
    return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "this executable was linked without the JPEG decoder: give a .npy "
                      "file");
}
static cuvil_status decode_png(const uint8_t *data, size_t size, rgb_image *img) {
    (void)data, (void)size, (void)img;
    return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "this executable was linked without the PNG decoder: give a .npy "
                      "file");
}

#endif

/* --- pre-processing --------------------------------------------------------- */

typedef struct {
    int first, taps; /* input pixels first .. first + taps - 1 */
    float *w; /* taps weights, summing to 1 */
} filter;

/* Weights of output pixels offset .. offset + n - 1 of a `in` -> `out` resize. */
static float *make_filters(int in, int out, int offset, int n, filter *f) {
    double scale = (double)in / out, support = scale > 1.0 ? scale : 1.0;
    int max_taps = (int)ceil(support) * 2 + 3, i, k;
    float *weights = (float *)malloc((size_t)n * (size_t)max_taps * sizeof(float));
    if (weights == NULL) return NULL;
    for (i = 0; i < n; i++) {
        double center = (offset + i + 0.5) * scale, sum = 0.0;
        int lo = (int)floor(center - support - 0.5), hi = (int)ceil(center + support - 0.5);
        if (lo < 0) lo = 0;
        if (hi > in - 1) hi = in - 1;
        if (hi - lo + 1 > max_taps) hi = lo + max_taps - 1;
        f[i].first = lo;
        f[i].taps = hi - lo + 1;
        f[i].w = weights + (size_t)i * max_taps;
        for (k = 0; k < f[i].taps; k++) {
            double d = fabs((lo + k + 0.5 - center) / support);
            f[i].w[k] = (float)(d < 1.0 ? 1.0 - d : 0.0);
            sum += d < 1.0 ? 1.0 - d : 0.0;
        }
        for (k = 0; k < f[i].taps; k++) f[i].w[k] = sum > 0 ? (float)(f[i].w[k] / sum) : (float)(k == 0);
    }
    return weights;
}

static int round_half_even_half(int d) { /* round(d / 2) with ties to even, d >= 0 */
    int q = d / 2;
    return (d % 2 && q % 2) ? q + 1 : q;
}

cuvil_status cuvil_image_preprocess(const uint8_t *rgb, int width, int height, const cuvil_image_pre *pre,
                                    const cuvil_tensor_desc *t, float *dst) {
    const int64_t *s = t->shape + (t->rank - 3); /* [C,H,W] or [H,W,C] */
    int nhwc = pre->layout == CUVIL_LAYOUT_NHWC;
    int channels = (int)(nhwc ? s[2] : s[0]), oh = (int)(nhwc ? s[0] : s[1]), ow = (int)(nhwc ? s[1] : s[2]);
    int rh = height, rw = width, top, left, y, x, c, k, row0, row1;
    filter *fy = NULL, *fx = NULL;
    float *wy = NULL, *wx = NULL, *band = NULL;
    cuvil_status st = CUVIL_OK;
    if (pre->resize_short > 0) {
        if (height <= width) {
            rh = pre->resize_short;
            rw = (int)((int64_t)pre->resize_short * width / height);
        } else {
            rw = pre->resize_short;
            rh = (int)((int64_t)pre->resize_short * height / width);
        }
    } else if (pre->resize_h > 0) {
        rh = pre->resize_h;
        rw = pre->resize_w;
    }
    if (rh < oh || rw < ow)
        return cuvil_fail(CUVIL_ERR_SHAPE, "image of %dx%d (resized to %dx%d) is smaller than the model's %dx%d crop",
                          width, height, rw, rh, ow, oh);
    top = round_half_even_half(rh - oh);
    left = round_half_even_half(rw - ow);
    fy = (filter *)malloc((size_t)oh * sizeof *fy);
    fx = (filter *)malloc((size_t)ow * sizeof *fx);
    if (fy == NULL || fx == NULL || (wy = make_filters(height, rh, top, oh, fy)) == NULL ||
        (wx = make_filters(width, rw, left, ow, fx)) == NULL) {
        st = cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate the resize filters");
        goto done;
    }
    row0 = fy[0].first;
    row1 = fy[oh - 1].first + fy[oh - 1].taps; /* rows [row0, row1) feed the crop */
    band = (float *)malloc((size_t)(row1 - row0) * (size_t)ow * 3 * sizeof(float));
    if (band == NULL) {
        st = cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate the resize buffer");
        goto done;
    }
    for (y = row0; y < row1; y++) { /* horizontal pass */
        const uint8_t *src = rgb + (size_t)y * width * 3;
        float *out = band + (size_t)(y - row0) * ow * 3;
        for (x = 0; x < ow; x++) {
            float acc[3] = {0, 0, 0};
            for (k = 0; k < fx[x].taps; k++) {
                const uint8_t *px = src + (size_t)(fx[x].first + k) * 3;
                for (c = 0; c < 3; c++) acc[c] += fx[x].w[k] * px[c];
            }
            for (c = 0; c < 3; c++) out[x * 3 + c] = acc[c];
        }
    }
    for (y = 0; y < oh; y++) { /* vertical pass, colour, normalisation, layout */
        for (x = 0; x < ow; x++) {
            float v[3] = {0, 0, 0}, px[3];
            for (k = 0; k < fy[y].taps; k++) {
                const float *in = band + ((size_t)(fy[y].first + k - row0) * ow + x) * 3;
                for (c = 0; c < 3; c++) v[c] += fy[y].w[k] * in[c];
            }
            if (pre->color == CUVIL_COLOR_GRAY) px[0] = 0.299f * v[0] + 0.587f * v[1] + 0.114f * v[2];
            for (c = 0; c < channels; c++) {
                float value = pre->color == CUVIL_COLOR_GRAY ? px[0] : v[pre->color == CUVIL_COLOR_BGR ? 2 - c : c];
                value = (value * pre->scale - pre->mean[c]) / pre->std[c];
                dst[nhwc ? ((size_t)y * ow + x) * channels + c : ((size_t)c * oh + y) * ow + x] = value;
            }
        }
    }
done:
    free(band);
    free(wx);
    free(wy);
    free(fx);
    free(fy);
    return st;
}

cuvil_status cuvil_image_load(const uint8_t *data, size_t size, const cuvil_image_pre *pre,
                              const cuvil_tensor_desc *t, float *dst) {
    rgb_image img = {NULL, 0, 0};
    cuvil_status st;
    if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) st = decode_jpeg(data, size, &img);
    else if (size >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) st = decode_png(data, size, &img);
    else return cuvil_fail(CUVIL_ERR_FORMAT, "not a JPEG, PNG or .npy file");
    if (st == CUVIL_OK) st = cuvil_image_preprocess(img.pixels, img.width, img.height, pre, t, dst);
    free(img.pixels);
    return st;
}
