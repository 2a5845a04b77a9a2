/* .npy reading and writing (format versions 1.0-3.0, little-endian, C order).
 *
 * The header is parsed as the small Python dict literal NumPy writes
 * ({'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }), never evaluated.
 * Every number is checked for overflow, the shape and dtype must equal the
 * model's, and the data must be exactly the declared number of bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_app.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .npy reader and writer assume a little-endian target"
#endif

typedef struct {
    const char *p, *end;
} cursor;

typedef struct {
    char descr[16];
    int have_descr, have_fortran, have_shape;
    int fortran;
    int rank;
    int64_t shape[CUVIL_MAX_RANK];
} npy_header;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string without escapes ('...' or "..."), copied into buf. */
static int parse_str(cursor *c, char *buf, size_t cap) {
    char q;
    size_t n = 0;
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    q = *c->p++;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return 0;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    buf[n] = '\0';
    return 1;
}

static int parse_word(cursor *c, const char *word) {
    size_t n = strlen(word);
    skip_ws(c);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static cuvil_status parse_shape(cursor *c, npy_header *h) {
    if (!eat(c, '(')) return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: 'shape' is not a tuple");
    h->rank = 0;
    for (;;) {
        int64_t v = 0;
        int digits = 0;
        if (eat(c, ')')) return CUVIL_OK;
        skip_ws(c);
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return cuvil_fail(CUVIL_ERR_TOO_LARGE, "malformed .npy header: a dimension overflows 64 bits");
            v = v * 10 + (*c->p++ - '0');
            digits++;
        }
        if (!digits) return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: bad 'shape' tuple");
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
        if (h->rank == CUVIL_MAX_RANK)
            return cuvil_fail(CUVIL_ERR_SHAPE, "the .npy array has more than %d dimensions", CUVIL_MAX_RANK);
        h->shape[h->rank++] = v;
        if (eat(c, ',')) continue;
        if (eat(c, ')')) return CUVIL_OK;
        return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: bad 'shape' tuple");
    }
}

static cuvil_status parse_header(const char *text, size_t len, npy_header *h) {
    cursor c = {text, text + len};
    char key[32];
    cuvil_status st;
    memset(h, 0, sizeof *h);
    if (!eat(&c, '{')) return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: not a dict");
    while (!eat(&c, '}')) {
        if (!parse_str(&c, key, sizeof key) || !eat(&c, ':'))
            return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: expected a quoted key");
        if (strcmp(key, "descr") == 0 && !h->have_descr) {
            if (!parse_str(&c, h->descr, sizeof h->descr))
                return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "unsupported .npy dtype (structured or too long)");
            h->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !h->have_fortran) {
            if (parse_word(&c, "True")) h->fortran = 1;
            else if (!parse_word(&c, "False"))
                return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: bad 'fortran_order'");
            h->have_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !h->have_shape) {
            if ((st = parse_shape(&c, h)) != CUVIL_OK) return st;
            h->have_shape = 1;
        } else {
            char shown[4 * sizeof key + 8];
            return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: unexpected or repeated key '%s'",
                              cuvil_printable(key, shown, sizeof shown));
        }
        if (!eat(&c, ',')) {
            if (eat(&c, '}')) break;
            return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: expected ',' or '}'");
        }
    }
    skip_ws(&c);
    if (c.p != c.end) return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: text after the dict");
    if (!h->have_descr || !h->have_fortran || !h->have_shape)
        return cuvil_fail(CUVIL_ERR_FORMAT, "malformed .npy header: 'descr', 'fortran_order' or 'shape' missing");
    return CUVIL_OK;
}

/* '<f4' -> CUVIL_F32 etc.; big-endian multi-byte types are refused. */
static cuvil_status descr_dtype(const char *descr, cuvil_dtype *out) {
    static const struct {
        const char *code;
        cuvil_dtype dtype;
    } table[] = {{"f4", CUVIL_F32}, {"f2", CUVIL_F16}, {"f8", CUVIL_F64}, {"i8", CUVIL_I64}, {"i4", CUVIL_I32},
                 {"i1", CUVIL_I8},  {"u1", CUVIL_U8},  {"b1", CUVIL_BOOL}};
    char order = descr[0], shown[80];
    size_t i;
    if (strcmp(descr, "?") == 0) {
        *out = CUVIL_BOOL;
        return CUVIL_OK;
    }
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "unsupported .npy dtype '%s'",
                          cuvil_printable(descr, shown, sizeof shown));
    for (i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(descr + 1, table[i].code) != 0) continue;
        if (order == '>' && cuvil_dtype_size(table[i].dtype) > 1)
            return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "big-endian .npy data ('%s') is not supported; save it "
                              "little-endian (arr.astype(arr.dtype.newbyteorder('<')))", descr);
        *out = table[i].dtype;
        return CUVIL_OK;
    }
    return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "unsupported .npy dtype '%s'",
                      cuvil_printable(descr, shown, sizeof shown));
}

static void format_dims(char *buf, size_t cap, const int64_t *dims, int rank, const char *open, const char *close) {
    size_t n = (size_t)snprintf(buf, cap, "%s", open);
    int k;
    for (k = 0; k < rank && n < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", k ? ", " : "", (long long)dims[k]);
    if (n < cap) snprintf(buf + n, cap - n, "%s%s", rank == 1 && open[0] == '(' ? "," : "", close);
}

static cuvil_status check_against(const npy_header *h, const cuvil_tensor_desc *t) {
    cuvil_dtype dtype = CUVIL_DTYPE_INVALID;
    cuvil_status st;
    char have[160], want[160];
    int k, big = 0;
    if ((st = descr_dtype(h->descr, &dtype)) != CUVIL_OK) return st;
    if (dtype != t->dtype)
        return cuvil_fail(CUVIL_ERR_DTYPE, "dtype %s ('%s') does not match the model's %s", cuvil_dtype_name(dtype),
                          h->descr, cuvil_dtype_name(t->dtype));
    format_dims(have, sizeof have, h->shape, h->rank, "(", ")");
    format_dims(want, sizeof want, t->shape, t->rank, "[", "]");
    if (h->rank != t->rank) return cuvil_fail(CUVIL_ERR_SHAPE, "shape %s does not match the model's %s", have, want);
    for (k = 0; k < t->rank; k++) {
        if (h->shape[k] != t->shape[k])
            return cuvil_fail(CUVIL_ERR_SHAPE, "shape %s does not match the model's %s", have, want);
        big += h->shape[k] > 1;
    }
    if (h->fortran && big > 1)
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "Fortran-order .npy arrays are not supported; save "
                          "np.ascontiguousarray(arr)");
    return CUVIL_OK;
}

/* Opens `path` and reads its .npy header; on success *out is positioned at the data. */
static cuvil_status open_npy(const char *path, npy_header *h, FILE **out) {
    unsigned char pre[12];
    char *text;
    size_t hlen;
    cuvil_status st;
    FILE *f;
    *out = NULL;
    if ((st = cuvil_open_input(path, &f)) != CUVIL_OK) return st;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_FORMAT, "not a .npy file (bad magic or too short)");
    }
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            fclose(f);
            return cuvil_fail(CUVIL_ERR_FORMAT, "truncated .npy header");
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    } else {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "unsupported .npy format version %d.%d", pre[6], pre[7]);
    }
    if (hlen > CUVIL_NPY_MAX_HEADER) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, ".npy header of %zu bytes exceeds the %d-byte limit", hlen,
                          CUVIL_NPY_MAX_HEADER);
    }
    text = (char *)malloc(hlen + 1);
    if (text == NULL) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_OUT_OF_MEMORY, "cannot allocate the .npy header");
    }
    if (fread(text, 1, hlen, f) != hlen) {
        free(text);
        fclose(f);
        return cuvil_fail(CUVIL_ERR_FORMAT, "truncated .npy header");
    }
    st = parse_header(text, hlen, h);
    free(text);
    if (st != CUVIL_OK) {
        fclose(f);
        return st;
    }
    *out = f;
    return CUVIL_OK;
}

cuvil_status cuvil_npy_shape(const char *path, int64_t *dims, int *rank) {
    npy_header h;
    FILE *f;
    cuvil_status st = open_npy(path, &h, &f);
    int k;
    if (st != CUVIL_OK) return st;
    fclose(f);
    *rank = h.rank;
    for (k = 0; k < h.rank; k++) dims[k] = h.shape[k];
    return CUVIL_OK;
}

cuvil_status cuvil_npy_load(const char *path, const cuvil_tensor_desc *t, void *dst) {
    size_t got;
    npy_header h;
    cuvil_status st;
    FILE *f;
    if ((st = open_npy(path, &h, &f)) != CUVIL_OK) return st;
    if (st == CUVIL_OK) st = check_against(&h, t);
    if (st != CUVIL_OK) {
        fclose(f);
        return st;
    }
    got = t->nbytes ? fread(dst, 1, (size_t)t->nbytes, f) : 0;
    if (got != t->nbytes) {
        int failed = ferror(f);
        fclose(f);
        if (failed) return cuvil_fail(CUVIL_ERR_IO, "read error in the .npy data");
        return cuvil_fail(CUVIL_ERR_FORMAT, "truncated .npy: expected %llu bytes of data, found %zu",
                          (unsigned long long)t->nbytes, got);
    }
    if (fgetc(f) != EOF) {
        fclose(f);
        return cuvil_fail(CUVIL_ERR_FORMAT, "unexpected bytes after the .npy data (expected %llu bytes)",
                          (unsigned long long)t->nbytes);
    }
    fclose(f);
    if (t->dtype == CUVIL_BOOL) {
        const uint8_t *b = (const uint8_t *)dst;
        uint64_t i;
        for (i = 0; i < t->nbytes; i++)
            if (b[i] > 1) return cuvil_fail(CUVIL_ERR_FORMAT, "bool .npy data holds a byte other than 0 or 1");
    }
    return CUVIL_OK;
}

static const char *npy_descr(cuvil_dtype dtype) {
    switch (dtype) {
    case CUVIL_F32: return "<f4";
    case CUVIL_F16: return "<f2";
    case CUVIL_F64: return "<f8";
    case CUVIL_I64: return "<i8";
    case CUVIL_I32: return "<i4";
    case CUVIL_I8: return "|i1";
    case CUVIL_U8: return "|u1";
    case CUVIL_BOOL: return "|b1";
    case CUVIL_DTYPE_INVALID: break;
    }
    return NULL;
}

cuvil_status cuvil_npy_write(FILE *f, const cuvil_tensor_desc *t, const void *data) {
    char dims[400], header[512];
    size_t n, total;
    const char *descr = npy_descr(t->dtype);
    if (descr == NULL) return cuvil_fail(CUVIL_ERR_UNSUPPORTED, "output %s has no .npy dtype", t->name);
    format_dims(dims, sizeof dims, t->shape, t->rank, "(", ")");
    n = (size_t)snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
                         dims);
    total = (10 + n + 1 + 63) / 64 * 64; /* magic + length + dict + '\n', padded to 64 */
    if (total - 10 > sizeof header - 1 || total - 10 > 65535)
        return cuvil_fail(CUVIL_ERR_TOO_LARGE, "output %s: .npy header too long", t->name);
    memset(header + n, ' ', total - 10 - n);
    header[total - 11] = '\n';
    if (fwrite("\x93NUMPY\x01\x00", 1, 8, f) != 8 || fputc((int)((total - 10) & 0xff), f) == EOF ||
        fputc((int)((total - 10) >> 8), f) == EOF || fwrite(header, 1, total - 10, f) != total - 10 ||
        (t->nbytes && fwrite(data, 1, (size_t)t->nbytes, f) != t->nbytes))
        return cuvil_fail(CUVIL_ERR_IO, "cannot write the .npy output");
    return CUVIL_OK;
}
