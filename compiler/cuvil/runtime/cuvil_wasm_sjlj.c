/* The helpers clang 14's WebAssembly setjmp/longjmp lowering (-mllvm -wasm-enable-sjlj,
 * with -mexception-handling) calls; linked into wasm32-wasi executables that decode
 * images, since libjpeg's and libpng's error exits longjmp back to cuvil_image.c.
 *
 * A function that calls setjmp keeps a table of (id, label) pairs, one per setjmp call
 * it made, ended by id 0; saveSetjmp gives each call a new id, stores it in the jmp_buf
 * and returns the table (reallocated when full, its new size left for getTempRet0).
 * longjmp becomes __wasm_longjmp, which throws the __c_longjmp tag with a pointer to
 * {env, value}; each function with setjmp catches it, asks testSetjmp whether the id
 * in env is one of its own (the label to resume at) or not (0: throw it on). */
#ifdef __wasm__
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint32_t id, label;
} cuvil_setjmp_entry;

static uint32_t temp_ret0, last_id;

uint32_t getTempRet0(void) { return temp_ret0; }
void setTempRet0(uint32_t value) { temp_ret0 = value; }

cuvil_setjmp_entry *saveSetjmp(uint32_t *env, uint32_t label, cuvil_setjmp_entry *table, uint32_t size) {
    uint32_t i = 0;
    while (i < size && table[i].id != 0) i++;
    if (i == size) { /* full: double it (size + 1 entries, for the terminating 0) */
        table = (cuvil_setjmp_entry *)realloc(table, sizeof *table * (2 * (size_t)size + 1));
        if (table == NULL) abort();
        size *= 2;
    }
    *env = ++last_id;
    table[i].id = *env;
    table[i].label = label;
    table[i + 1].id = 0;
    temp_ret0 = size;
    return table;
}

uint32_t testSetjmp(uint32_t id, const cuvil_setjmp_entry *table, uint32_t size) {
    uint32_t i;
    for (i = 0; i < size && table[i].id != 0; i++)
        if (table[i].id == id) return table[i].label;
    return 0;
}

static struct {
    void *env;
    int value;
} longjmp_args;

void __wasm_longjmp(void *env, int value) {
    longjmp_args.env = env;
    longjmp_args.value = value != 0 ? value : 1; /* longjmp(env, 0) returns 1 from setjmp */
    __builtin_wasm_throw(1, &longjmp_args);     /* tag 1: __c_longjmp */
}
#endif
