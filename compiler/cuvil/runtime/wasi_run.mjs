// Run a wasm32-wasi executable built by Cuvil under Node's WASI (Node >= 20):
//
//     node wasi_run.mjs model.wasm [ARGS...]
//
// The module sees the host file system under "/" and starts in the current
// directory, so relative and absolute paths in ARGS work as they do natively.
// The exit code is the module's. `cuvil run` uses this for .wasm artifacts.
import { readFile } from "node:fs/promises";
import { argv, cwd, exit, stderr } from "node:process";
import { WASI } from "node:wasi";

if (argv.length < 3) {
  stderr.write("usage: node wasi_run.mjs MODULE.wasm [ARGS...]\n");
  exit(2);
}
const [path, ...args] = argv.slice(2);
const wasi = new WASI({
  version: "preview1",
  args: [path.split("/").pop(), ...args],
  env: { PWD: cwd() },
  preopens: { "/": "/" },
  returnOnExit: true,
});
let bytes;
try {
  bytes = await readFile(path);
} catch (e) {
  stderr.write(`wasi_run: cannot read ${path}: ${e.message}\n`);
  exit(2);
}
const module = await WebAssembly.compile(bytes);
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
