/* A post-processing plugin: a detector's raw output -> detection-style JSON.
 *
 * The model's first output is f32 [1, N, 4 + K] (or [N, 4 + K]): per candidate a box
 * (cx, cy, w, h, in [0, 1] of the image) and K class scores. A candidate is kept
 * when its best class scores at least `score_threshold`; then greedy non-maximum
 * suppression per class drops boxes overlapping a better one of the same class by
 * more than `iou_threshold`; at most `max_detections` remain, best first:
 *
 *   {"detections": [
 *     {"label": "cat", "class": 0, "score": 0.912345, "box": [x1, y1, x2, y2]},
 *     ...]}
 *
 * Options (config: plugin.postprocess.options):
 *   score_threshold  default 0.5
 *   iou_threshold    default 0.5
 *   max_detections   default 100
 *   labels           comma-separated class names (default: "class<k>")
 */
#include <stdlib.h>
#include <string.h>

#include "cuvil_plugin.h"

typedef struct {
    float score_threshold, iou_threshold;
    int max_detections;
    char *labels; /* the option, with ',' replaced by '\0' */
    int n_labels;
} det_settings;

typedef struct {
    float box[4], score;
    int cls;
} detection;

static cuvil_status det_init(void **state, const cuvil_plugin_options *options) {
    det_settings *s = (det_settings *)calloc(1, sizeof *s);
    const char *labels = cuvil_option(options, "labels", "");
    char *end;
    if (s == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "detections: out of memory");
    *state = s;
    s->score_threshold = strtof(cuvil_option(options, "score_threshold", "0.5"), &end);
    s->iou_threshold = strtof(cuvil_option(options, "iou_threshold", "0.5"), &end);
    s->max_detections = atoi(cuvil_option(options, "max_detections", "100"));
    if (s->max_detections < 1) return cuvil_fail(CUVIL_ERR_INVALID_ARGUMENT, "detections: max_detections < 1");
    s->labels = (char *)malloc(strlen(labels) + 1);
    if (s->labels == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "detections: out of memory");
    memcpy(s->labels, labels, strlen(labels) + 1);
    if (labels[0]) {
        char *p;
        s->n_labels = 1;
        for (p = s->labels; *p; p++)
            if (*p == ',') *p = '\0', s->n_labels++;
    }
    return CUVIL_OK;
}

static void det_destroy(void *state) {
    det_settings *s = (det_settings *)state;
    free(s->labels);
    free(s);
}

static const char *label_of(const det_settings *s, int k) {
    const char *p = s->labels;
    int i;
    if (k >= s->n_labels) return NULL;
    for (i = 0; i < k; i++) p += strlen(p) + 1;
    return p;
}

static float iou(const float *a, const float *b) {
    float ix = (a[2] < b[2] ? a[2] : b[2]) - (a[0] > b[0] ? a[0] : b[0]);
    float iy = (a[3] < b[3] ? a[3] : b[3]) - (a[1] > b[1] ? a[1] : b[1]);
    float inter = (ix > 0 ? ix : 0) * (iy > 0 ? iy : 0);
    float uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    return uni > 0 ? inter / uni : 0.0f;
}

static int by_score(const void *a, const void *b) {
    const detection *x = (const detection *)a, *y = (const detection *)b;
    return x->score < y->score ? 1 : x->score > y->score ? -1 : 0;
}

static cuvil_status det_postprocess(void *state, int n_outputs, const cuvil_tensor_desc *outputs,
                                    const void *const *data, const cuvil_writer *out) {
    const det_settings *s = (const det_settings *)state;
    const cuvil_tensor_desc *t = &outputs[0];
    const float *v = (const float *)data[0];
    int64_t n, k, i, j;
    int kept = 0;
    detection *cand;
    int64_t m = 0;
    cuvil_status st;
    if (n_outputs < 1 || t->dtype != CUVIL_F32 || t->rank < 2 || t->rank > 3 || (t->rank == 3 && t->shape[0] != 1) ||
        t->shape[t->rank - 1] < 5)
        return cuvil_fail(CUVIL_ERR_SHAPE, "detections: output '%s' must be f32 [1, N, 4 + classes]", t->name);
    n = t->shape[t->rank - 2];
    k = t->shape[t->rank - 1] - 4;
    cand = (detection *)malloc((size_t)(n > 0 ? n : 1) * sizeof *cand);
    if (cand == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "detections: out of memory");
    for (i = 0; i < n; i++) {
        const float *row = v + i * (k + 4);
        int best = 0;
        for (j = 1; j < k; j++)
            if (row[4 + j] > row[4 + best]) best = (int)j;
        if (row[4 + best] < s->score_threshold) continue;
        cand[m].box[0] = row[0] - row[2] / 2, cand[m].box[1] = row[1] - row[3] / 2;
        cand[m].box[2] = row[0] + row[2] / 2, cand[m].box[3] = row[1] + row[3] / 2;
        cand[m].score = row[4 + best];
        cand[m].cls = best;
        m++;
    }
    qsort(cand, (size_t)m, sizeof *cand, by_score);
    st = cuvil_writef(out, "{\"detections\": [");
    for (i = 0; i < m && st == CUVIL_OK && kept < s->max_detections; i++) {
        int suppressed = 0;
        const char *label = label_of(s, cand[i].cls);
        for (j = 0; j < i && !suppressed; j++) /* cand[j].score < 0: itself suppressed */
            suppressed = cand[j].score >= 0 && cand[j].cls == cand[i].cls && iou(cand[j].box, cand[i].box) >
                         s->iou_threshold;
        if (suppressed) {
            cand[i].score = -1.0f;
            continue;
        }
        st = cuvil_writef(out, "%s\n  {\"label\": \"", kept ? "," : "");
        if (st == CUVIL_OK) st = label ? cuvil_writef(out, "%s", label) : cuvil_writef(out, "class%d", cand[i].cls);
        if (st == CUVIL_OK)
            st = cuvil_writef(out, "\", \"class\": %d, \"score\": %.6f, \"box\": [%.6f, %.6f, %.6f, %.6f]}",
                              cand[i].cls, cand[i].score, cand[i].box[0], cand[i].box[1], cand[i].box[2],
                              cand[i].box[3]);
        kept++;
    }
    if (st == CUVIL_OK) st = cuvil_writef(out, "\n]}\n");
    free(cand);
    return st;
}

CUVIL_PLUGIN(detections, .init = det_init, .destroy = det_destroy, .postprocess = det_postprocess);
