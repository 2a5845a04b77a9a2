/* libFuzzer harness: a plugin's view of its options (cuvil_plugin.h: cuvil_option, the
 * lookup every plugin uses) and the executable's message escaping (cuvil_printable),
 * on arbitrary bytes.
 *
 * The input is split at NUL bytes into strings: key, value, key, value, ... (at most
 * 64 pairs), as the generated glue hands a config's `options` to a plugin's init.
 * Every key must be found with its first value, a missing key must give the fallback,
 * and every string's printable form must fit its buffer and be printable ASCII. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_app.h"

#define MAX_PAIRS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size + 1), *p, *end;
    const char *keys[MAX_PAIRS], *values[MAX_PAIRS];
    char printable[96];
    cuvil_plugin_options o;
    int n = 0, i, j;
    if (text == NULL) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    p = text, end = text + size;
    while (p < end && n < MAX_PAIRS) {
        keys[n] = p;
        p += strlen(p) + 1;
        values[n] = p < end ? p : "";
        p += p < end ? strlen(p) + 1 : 0;
        n++;
    }
    o.count = n, o.keys = keys, o.values = values;
    for (i = 0; i < n; i++) {
        const char *got = cuvil_option(&o, keys[i], NULL), *s;
        for (j = 0; j < i && strcmp(keys[j], keys[i]) != 0; j++) {}
        if (got != values[j]) abort(); /* the first pair with that key */
        s = cuvil_printable(values[i], printable, sizeof printable);
        if (strlen(s) >= sizeof printable) abort();
        for (; *s; s++)
            if (*s < 0x20 || *s > 0x7e) abort();
    }
    if (cuvil_option(&o, "\x01no such key\x02", "fallback")[0] != 'f' && n < MAX_PAIRS) {
        for (i = 0; i < n && strcmp(keys[i], "\x01no such key\x02") != 0; i++) {}
        if (i == n) abort();
    }
    if (cuvil_option(NULL, "k", "fb")[0] != 'f') abort();
    free(text);
    return 0;
}
