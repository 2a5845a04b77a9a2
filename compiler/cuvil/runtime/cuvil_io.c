/* Files and JSON for the executable: checked opens, bounded reads, atomic writes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#if !defined(__wasi__)
#include <dirent.h>
#include <signal.h>
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

/* --- temporary files --------------------------------------------------------
 * An output is written to `DIR/.cuvil-PPPPPPPP-RRRRRR.tmp` (the process id in hex,
 * six random characters: the names the compiler's Python side uses too), then
 * renamed over the output. SIGINT, SIGTERM and SIGHUP during the write remove the
 * temporary file before the process ends as the signal says; after a SIGKILL the
 * next run writing to the same directory removes it (its process is gone). */

#define TEMP_PREFIX ".cuvil-"
#define TEMP_NAME_LEN 26 /* .cuvil- 8 hex - 6 chars .tmp */
#define TEMP_STALE_S (24L * 3600L) /* a live process id's temp file older than this is stale too */

static char *volatile current_temp; /* the temporary file being written, for the handler */

#if !defined(__wasi__)
static int is_temp_name(const char *name, unsigned long *pid) {
    size_t i;
    if (strlen(name) != TEMP_NAME_LEN || strncmp(name, TEMP_PREFIX, 7) != 0 || name[15] != '-' ||
        strcmp(name + 22, ".tmp") != 0)
        return 0;
    *pid = 0;
    for (i = 7; i < 15; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
        *pid = *pid * 16 + (unsigned long)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    for (i = 16; i < 22; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'z'))) return 0;
    return 1;
}

static void remove_temp_on_signal(int sig) {
    char *tmp = current_temp;
    if (tmp != NULL) unlink(tmp); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Remove the temporary files in `dir` whose process is gone (or that are a day old). */
static void clean_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    time_t now = time(NULL);
    if (d == NULL) return;
    while ((e = readdir(d)) != NULL) {
        unsigned long pid;
        char path[4096];
        struct stat sb;
        if (!is_temp_name(e->d_name, &pid) || pid == (unsigned long)getpid()) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* directories: the compiler's */
        if ((pid <= 0x7fffffffUL && kill((pid_t)pid, 0) != 0 && errno == ESRCH) || now - sb.st_mtime > TEMP_STALE_S)
            unlink(path);
    }
    closedir(d);
}
#endif

/* Create and open a new temporary file in the directory of `path`; its name in `*tmp`
 * (malloc'd). */
static int make_temp(const char *path, char **tmp) {
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    unsigned long pid, seed;
    struct timespec ts;
    int attempt, fd = -1;
    char *name = (char *)malloc(dirlen + TEMP_NAME_LEN + 1);
    *tmp = name;
    if (name == NULL) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(name, path, dirlen);
#if defined(__wasi__)
    pid = 0;
#else
    pid = (unsigned long)getpid() & 0xffffffffUL;
    name[dirlen] = '\0';
    clean_stale_temps(dirlen ? name : ".");
#endif
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = ((unsigned long)ts.tv_nsec * 2654435761UL) ^ (unsigned long)ts.tv_sec ^ (pid << 16);
    for (attempt = 0; attempt < 64; attempt++) {
        unsigned long r = seed + (unsigned long)attempt * 104729UL;
        int k;
        snprintf(name + dirlen, TEMP_NAME_LEN + 1, TEMP_PREFIX "%08lx-", pid);
        for (k = 0; k < 6; k++, r /= 36) name[dirlen + 16 + k] = alphabet[r % 36];
        memcpy(name + dirlen + 22, ".tmp", 5);
        fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0666); /* the umask applies: the usual mode */
        if (fd >= 0 || errno != EEXIST) break;
    }
    return fd;
}

cuvil_status cuvil_write_atomic(const char *path, cuvil_status (*write)(FILE *f, void *arg), void *arg) {
    char *tmp = NULL;
    cuvil_status st;
    FILE *f;
    int fd;
#if !defined(__wasi__)
    static const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa, old[3];
    sigset_t block, saved;
    int i;
    /* Signals held while the name is created and published, so none ends the process
     * between the two; then the handler removes the file if one comes. */
    sigemptyset(&block);
    for (i = 0; i < 3; i++) sigaddset(&block, sigs[i]);
    sigprocmask(SIG_BLOCK, &block, &saved);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_temp_on_signal;
    sigemptyset(&sa.sa_mask);
    for (i = 0; i < 3; i++) { /* a signal ignored (nohup) stays ignored */
        sigaction(sigs[i], NULL, &old[i]);
        if (old[i].sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
    }
#endif
    fd = make_temp(path, &tmp);
    if (fd >= 0) current_temp = tmp;
#if !defined(__wasi__)
    sigprocmask(SIG_SETMASK, &saved, NULL);
#endif
    if (fd < 0) {
        st = cuvil_fail(CUVIL_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        goto done;
    }
    f = fdopen(fd, "wb");
    if (f == NULL) {
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        goto done;
    }
    st = write(f, arg);
    if (st == CUVIL_OK && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0))
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (fclose(f) != 0 && st == CUVIL_OK) st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (st == CUVIL_OK && rename(tmp, path) != 0)
        st = cuvil_fail(CUVIL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (st != CUVIL_OK) unlink(tmp);
done:
#if !defined(__wasi__)
    sigprocmask(SIG_BLOCK, &block, NULL);
    current_temp = NULL;
    for (i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    sigprocmask(SIG_SETMASK, &saved, NULL);
#endif
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
