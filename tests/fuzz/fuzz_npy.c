/* libFuzzer harness: the executable's .npy reader (cuvil_npy.c) on arbitrary bytes.
 *
 * Each input is written to a file on a tmpfs (the reader's interface is a path: the
 * magic, version, header-length and header checks, then the data's size) and read as
 * inputs of three models' shapes and dtypes, and by cuvil_npy_shape. Any input must
 * give CUVIL_OK or a status with a one-line message; AddressSanitizer and
 * UndefinedBehaviorSanitizer (built in) turn any bad access into a finding. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuvil_app.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    int fd;
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "%s/cuvil-fuzz-npy-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    return 0;
}

static void check_message(cuvil_status st) {
    const char *msg = cuvil_last_error();
    if (st == CUVIL_OK) return;
    if (msg == NULL || msg[0] == '\0' || strchr(msg, '\n') != NULL) abort(); /* a failure says why, in one line */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int64_t s1[] = {1, 3, 16, 16}, s2[] = {7}, s3[] = {2, 0, 5};
    static const cuvil_tensor_desc ts[] = {
        {"x", CUVIL_F32, 4, s1, 768, 3072},
        {"ids", CUVIL_I64, 1, s2, 7, 56},
        {"empty", CUVIL_U8, 3, s3, 0, 0},
    };
    static uint8_t dst[3072];
    int64_t dims[CUVIL_MAX_RANK];
    int rank = 0;
    size_t i;
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    for (i = 0; i < sizeof ts / sizeof ts[0]; i++) check_message(cuvil_npy_load(path, &ts[i], dst));
    check_message(cuvil_npy_shape(path, dims, &rank));
    if (rank < 0 || rank > CUVIL_MAX_RANK) abort();
    return 0;
}
