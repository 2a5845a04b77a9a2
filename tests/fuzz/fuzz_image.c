/* libFuzzer harness: image inputs (cuvil_image.c: JPEG/PNG decoding with libjpeg-turbo
 * and libpng, then resize, centre crop, normalise, layout) on arbitrary bytes.
 *
 * The first input byte picks the pre-processing (shorter side or exact resize, NCHW or
 * NHWC, RGB, BGR or grey), the rest is the file. Any input must give CUVIL_OK, with
 * every output value finite, or a status with a one-line message. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_app.h"

static void check_message(cuvil_status st) {
    const char *msg = cuvil_last_error();
    if (st == CUVIL_OK) return;
    if (msg == NULL || msg[0] == '\0' || strchr(msg, '\n') != NULL) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const float mean3[] = {0.485f, 0.456f, 0.406f}, std3[] = {0.229f, 0.224f, 0.225f};
    static const float mean1[] = {0.5f}, std1[] = {0.25f};
    static const int64_t nchw[] = {1, 3, 12, 10}, nhwc[] = {1, 12, 10, 3}, grey[] = {1, 1, 12, 10};
    static float dst[360];
    cuvil_image_pre pre;
    cuvil_tensor_desc t = {"image", CUVIL_F32, 4, nchw, 360, 360 * sizeof(float)};
    uint8_t mode;
    cuvil_status st;
    int i;
    if (size < 1) return 0;
    mode = data[0];
    memset(&pre, 0, sizeof pre);
    pre.kind = CUVIL_PRE_IMAGE;
    pre.scale = 1.0f / 255.0f;
    pre.mean = mean3;
    pre.std = std3;
    switch (mode % 3) {
    case 0: pre.resize_short = 14; break;
    case 1: pre.resize_h = 13, pre.resize_w = 11; break;
    default: break; /* no resize: the image must already be at least the crop */
    }
    switch ((mode / 3) % 4) {
    case 0: pre.layout = CUVIL_LAYOUT_NCHW, pre.color = CUVIL_COLOR_RGB; break;
    case 1: pre.layout = CUVIL_LAYOUT_NCHW, pre.color = CUVIL_COLOR_BGR; break;
    case 2: pre.layout = CUVIL_LAYOUT_NHWC, pre.color = CUVIL_COLOR_RGB, t.shape = nhwc; break;
    default:
        pre.layout = CUVIL_LAYOUT_NCHW, pre.color = CUVIL_COLOR_GRAY, t.shape = grey, t.count = 120;
        t.nbytes = 120 * sizeof(float), pre.mean = mean1, pre.std = std1;
        break;
    }
    st = cuvil_image_load(data + 1, size - 1, &pre, &t, dst);
    check_message(st);
    if (st == CUVIL_OK)
        for (i = 0; i < (int)t.count; i++)
            if (!isfinite(dst[i])) abort();
    return 0;
}
