// Runs a WASI command module with node's WASI (preview1): node run_wasi.mjs MODULE [ARGS...]
// Exit status: the module's.
import { readFile } from "node:fs/promises";
import { argv, env, exit } from "node:process";
import { WASI } from "node:wasi";

const [path, ...args] = argv.slice(2);
const wasi = new WASI({ version: "preview1", args: [path, ...args], env, preopens: { ".": "." } });
const module = await WebAssembly.compile(await readFile(path));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
