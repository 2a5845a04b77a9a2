/* setjmp/longjmp for wasm32-wasi, which wasi-libc does not provide. Code that calls
 * setjmp (cuvil_image.c, libpng) is compiled with `-mexception-handling -mllvm
 * -wasm-enable-sjlj`: clang then turns setjmp into calls of saveSetjmp/testSetjmp and
 * longjmp into __wasm_longjmp, which throws a WebAssembly exception that the function
 * that called setjmp catches. cuvil_wasm_sjlj.c defines those helpers. */
#ifndef CUVIL_WASM32_SETJMP_H
#define CUVIL_WASM32_SETJMP_H

typedef unsigned int jmp_buf[2]; /* [0]: the id saveSetjmp gives this setjmp call */

__attribute__((returns_twice)) int setjmp(jmp_buf env);
_Noreturn void longjmp(jmp_buf env, int value);

#endif
