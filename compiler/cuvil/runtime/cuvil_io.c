/* Files and JSON for the executable: checked opens, bounded reads, atomic writes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__wasi__)
#include <fcntl.h>
#include <time.h>
#endif

#include "cuvil_app.h"

const char *cuvil_printable(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    if (cap == 0) return "";
    for (; *s && n + 5 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') buf[n++] = (char)ch;
        else n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", ch);
    }
    buf[n] = '\0';
    return buf;
}

cuvil_status cuvil_open_input(const char *path, FILE **out) {
    struct stat sb;
    FILE *f;
    *out = NULL;
    if (stat(path, &sb) != 0) return cuvil_fail(CUVIL_ERR_IO, "cannot open the file: %s", strerror(errno));
    if (S_ISDIR(sb.st_mode)) return cuvil_fail(CUVIL_ERR_IO, "is a directory, not a file");
    if (!S_ISREG(sb.st_mode)) return cuvil_fail(CUVIL_ERR_IO, "is not a regular file");
    f = fopen(path, "rb");
    if (f == NULL) return cuvil_fail(CUVIL_ERR_IO, "cannot open the file: %s", strerror(errno));
    *out = f;
    return CUVIL_OK;
}

cuvil_status cuvil_read_file(const char *path, size_t max_size, uint8_t **data, size_t *size) {
    struct stat sb;
    FILE *f;
    uint8_t *buf;
    size_t n;
    cuvil_status st;
    *data = NULL;
    *size = 0;
    if ((st = cuvil_open_input(path, &f)) != CUVIL_OK) return st;
    if (fstat(fileno(f), &sb) != 0 || sb.st_size < 0) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_IO, "cannot read the file: %s", strerror(errno));
    }
    if ((uint64_t)sb.st_size > (uint64_t)max_size) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, "the file has %lld bytes, more than the %zu-byte limit",
                          (long long)sb.st_size, max_size);
    }
    buf = (uint8_t *)malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate %lld bytes for the file", (long long)sb.st_size);
    }
    n = fread(buf, 1, (size_t)sb.st_size + 1, f); /* one more: notice a file that grew */
    if (ferror(f) || n > (size_t)sb.st_size) {
        fclose(f);
        free(buf);
        return cuvil_fail(CUVIL_ERR_IO, "cannot read the file (read error, or it changed)");
    }
    fclose(f);
    *data = buf;
    *size = n;
    return CUVIL_OK;
}

/* Create and open the temporary file `tmp` (`len` bytes of path, room for 12 more). */
static int make_temp(char *tmp, size_t len) {
#if defined(__wasi__) /* wasi-libc has no mkstemp, umask or fchmod: O_EXCL over a few names */
    struct timespec ts;
    unsigned long seed;
    int attempt, fd = -1;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (unsigned long)ts.tv_nsec * 2654435761UL ^ (unsigned long)ts.tv_sec;
    for (attempt = 0; attempt < 64; attempt++) {
        snprintf(tmp + len, 12, ".tmp-%06lu", (seed + (unsigned long)attempt * 7919UL) % 1000000UL);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd >= 0 || errno != EEXIST) break;
    }
    return fd;
#else
    mode_t mask;
    int fd;
    memcpy(tmp + len, ".tmp-XXXXXX", 12);
    fd = mkstemp(tmp);
    if (fd < 0) return fd;
    mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask); /* mkstemp makes 0600; give the file the usual mode */
    return fd;
#endif
}

cuvil_status cuvil_write_atomic(const char *path, cuvil_status (*write)(FILE *f, void *arg), void *arg) {
    size_t len = strlen(path);
    char *tmp = (char *)malloc(len + 16);
    cuvil_status st;
    FILE *f;
    int fd;
    if (tmp == NULL) return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate a file name");
    memcpy(tmp, path, len);
    fd = make_temp(tmp, len);
    if (fd < 0) {
        st = cuvil_fail(CUVIL_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    f = fdopen(fd, "wb");
    if (f == NULL) {
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return st;
    }
    st = write(f, arg);
    if (st == CUVIL_OK && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0))
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (fclose(f) != 0 && st == CUVIL_OK) st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (st == CUVIL_OK && rename(tmp, path) != 0)
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (st != CUVIL_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* --- JSON ------------------------------------------------------------------ */

static float half_to_float(uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = ldexpf((float)(mant | 0x400), exp - 25);
    return (h & 0x8000) ? -v : v;
}

static double element(const cuvil_tensor_desc *t, const void *data, int64_t i) {
    switch (t->dtype) {
    case CUVIL_F32: return ((const float *)data)[i];
    case CUVIL_F64: return ((const double *)data)[i];
    case CUVIL_F16: return half_to_float(((const uint16_t *)data)[i]);
    case CUVIL_I64: return (double)((const int64_t *)data)[i];
    case CUVIL_I32: return ((const int32_t *)data)[i];
    case CUVIL_I8: return ((const int8_t *)data)[i];
    case CUVIL_U8: case CUVIL_BOOL: return ((const uint8_t *)data)[i];
    case CUVIL_DTYPE_INVALID: break;
    }
    return 0.0;
}

static void put_number(FILE *f, double v, int digits) {
    if (isnan(v) || isinf(v)) fputs("null", f); /* JSON has no NaN or infinity */
    else fprintf(f, "%.*g", digits, v);
}

static void put_element(FILE *f, const cuvil_tensor_desc *t, const void *data, int64_t i) {
    switch (t->dtype) {
    case CUVIL_I64: fprintf(f, "%lld", (long long)((const int64_t *)data)[i]); break;
    case CUVIL_BOOL: fputs(((const uint8_t *)data)[i] ? "true" : "false", f); break;
    case CUVIL_F64: put_number(f, element(t, data, i), 17); break;
    case CUVIL_F32: case CUVIL_F16: put_number(f, element(t, data, i), 9); break;
    default: fprintf(f, "%.0f", element(t, data, i)); break;
    }
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f); /* UTF-8 passes through */
    }
    fputc('"', f);
}

static void put_data(FILE *f, const cuvil_tensor_desc *t, const void *data) {
    int64_t i;
    fputc('[', f);
    for (i = 0; i < t->count; i++) {
        if (i) fputs(", ", f);
        put_element(f, t, data, i);
    }
    fputc(']', f);
}

/* "top_k": [...] of a classification output (one row of t->count classes). */
static cuvil_status put_top_k(FILE *f, const cuvil_tensor_desc *t, const cuvil_post *post, const void *data,
                              const char *indent) {
    int64_t n = t->count, i;
    int k = post->top_k < n ? post->top_k : (int)n, j;
    double *score = (double *)malloc((size_t)n * sizeof(double));
    unsigned char *taken = (unsigned char *)calloc((size_t)n, 1);
    double top = -INFINITY, sum = 0.0;
    if (t->rank > 0 && n != t->shape[t->rank - 1]) { /* a symbolic batch above 1 */
        free(score);
        free(taken);
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "classification of %s needs one row of scores, this run has %lld "
                          "rows: write the output as .npy", t->name, (long long)(n / (t->shape[t->rank - 1] ? t->shape[t->rank - 1] : 1)));
    }
    if (score == NULL || taken == NULL) {
        free(score);
        free(taken);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate the scores of %s", t->name);
    }
    for (i = 0; i < n; i++) {
        score[i] = element(t, data, i);
        if (score[i] > top) top = score[i];
    }
    if (post->softmax) {
        for (i = 0; i < n; i++) {
            score[i] = isnan(score[i]) ? 0.0 : exp(score[i] - top);
            sum += score[i];
        }
        for (i = 0; i < n; i++) score[i] = sum > 0 ? score[i] / sum : NAN;
    }
    fprintf(f, "%s\"top_k\": [", indent);
    for (j = 0; j < k; j++) {
        int64_t best = -1;
        for (i = 0; i < n; i++) /* highest score first; ties and NaNs by index */
            if (!taken[i] && (best < 0 || score[i] > score[best] || (isnan(score[best]) && !isnan(score[i]))))
                best = i;
        taken[best] = 1;
        fprintf(f, "%s\n%s  {\"index\": %lld, ", j ? "," : "", indent, (long long)best);
        if (post->n_labels > best) {
            fputs("\"label\": ", f);
            put_string(f, post->labels[best]);
            fputs(", ", f);
        }
        fputs("\"score\": ", f);
        put_number(f, score[best], 9);
        fputc('}', f);
    }
    fprintf(f, "\n%s]", indent);
    free(score);
    free(taken);
    return CUVIL_OK;
}

cuvil_status cuvil_json_write(FILE *f, const cuvil_app *app, void *const *outputs, int with_logits) {
    const cuvil_model_desc *m = app->model;
    cuvil_status st;
    int o, k;
    if (m->n_outputs == 1 && app->post[0].kind == CUVIL_POST_CLASSIFICATION) {
        fputs("{\n", f);
        if ((st = put_top_k(f, &m->outputs[0], &app->post[0], outputs[0], "  ")) != CUVIL_OK) return st;
        if (with_logits) {
            fputs(",\n  \"logits\": ", f);
            put_data(f, &m->outputs[0], outputs[0]);
        }
        fputs("\n}\n", f);
        return CUVIL_OK;
    }
    fputs("{\"outputs\": [", f);
    for (o = 0; o < m->n_outputs; o++) {
        const cuvil_tensor_desc *t = &m->outputs[o];
        fputs(o ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        put_string(f, t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": [", cuvil_dtype_name(t->dtype));
        for (k = 0; k < t->rank; k++) fprintf(f, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
        fputs("],\n", f);
        if (app->post[o].kind == CUVIL_POST_CLASSIFICATION) {
            if ((st = put_top_k(f, t, &app->post[o], outputs[o], "   ")) != CUVIL_OK) return st;
            if (with_logits) {
                fputs(",\n   \"logits\": ", f);
                put_data(f, t, outputs[o]);
            }
        } else {
            fputs("   \"data\": ", f);
            put_data(f, t, outputs[o]);
        }
        fputc('}', f);
    }
    fputs("\n]}\n", f);
    return CUVIL_OK;
}
