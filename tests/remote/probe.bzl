"""Probe actions for tests/remote/test_hermeticity.py: they prove that remote
execution runs actions on their declared inputs only, without network.

`file_probe` copies one file by path.

The action runs `cat PATH > OUT` with PATH either relative to the execroot (where a
local, unsandboxed build finds every file of the workspace) or absolute (`--define
cuvil_probe_path=...`). It declares `src` as its input when given; without it, it
reads a file it did not declare, which only works where the action is not isolated.

`port_probe` opens a TCP connection to 127.0.0.1:PORT (`--define
cuvil_probe_port=...`, a server the test runs on the client's machine): possible for
a local unsandboxed action, not inside the worker's network namespace.
"""

def _file_probe_impl(ctx):
    path = ctx.attr.path
    if path == "$(cuvil_probe_path)":
        path = ctx.var.get("cuvil_probe_path", "")
        if not path:
            fail("set --define=cuvil_probe_path=<absolute path>")
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.run_shell(
        outputs = [out],
        inputs = ctx.files.src,
        command = 'cat "$1" > "$2"',
        arguments = [path, out.path],
        mnemonic = "CuvilProbe",
        progress_message = "Reading %s (%s)" % (path, "declared" if ctx.files.src else "not declared"),
    )
    return [DefaultInfo(files = depset([out]))]

file_probe = rule(
    implementation = _file_probe_impl,
    attrs = {
        "path": attr.string(
            mandatory = True,
            doc = "The file to read: execroot-relative, or \"$(cuvil_probe_path)\".",
        ),
        "src": attr.label(allow_single_file = True, doc = "Declared input (omit to leave it undeclared)."),
    },
)

def _port_probe_impl(ctx):
    port = ctx.var.get("cuvil_probe_port", "")
    if not port.isdigit():
        fail("set --define=cuvil_probe_port=<port on 127.0.0.1>")
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.run_shell(
        outputs = [out],
        # bash's /dev/tcp: no tool needed; loopback only.
        command = 'exec 3<>"/dev/tcp/127.0.0.1/$1" && echo "connected to 127.0.0.1:$1" > "$2"',
        arguments = [port, out.path],
        mnemonic = "CuvilProbe",
        progress_message = "Connecting to 127.0.0.1:%s" % port,
    )
    return [DefaultInfo(files = depset([out]))]

port_probe = rule(implementation = _port_probe_impl)
