#!/usr/bin/env python3
"""A remote cache and a remote-execution worker on this machine, for Cuvil's Bazel
tests (tests/remote) and for trying `--config=remote-cache` / `--config=remote` by hand.

Everything binds to 127.0.0.1 only, on a free port unless one is given, and runs in the
foreground of the process that started it (the tests keep each server's process id and
stop it, and only it, when done).

    python tools/remote/cuvil_remote.py interpreter /opt/cuvil/python
        A Python interpreter at a fixed path over the project's .venv packages, without
        the editable install of the compiler (the Cuvil actions import it from their
        declared sources only). Its path goes into the action keys: every checkout and
        every worker that shares a cache uses the same one (CUVIL_PYTHON).

    python tools/remote/cuvil_remote.py build-worker DIR
        Compiles Bazel's own REAPI worker (src/tools/remote of Debian's
        bazel-bootstrap-source) against Bazel's server jar into DIR/classes, with its
        gRPC server bound to the loopback interface instead of all interfaces, and the
        Debian linux-sandbox as the resource its --sandboxing option extracts.

    python tools/remote/cuvil_remote.py nginx DIR [--port N]
        nginx serving Bazel's HTTP cache protocol (GET/PUT, WebDAV) from DIR/cache;
        --remote_cache=http://127.0.0.1:N. Stops on SIGTERM / Ctrl-C.

    python tools/remote/cuvil_remote.py worker DIR --classes WORKER/classes [--port N]
                                               [--hide PATH ...]
        The REAPI worker (CAS, action cache, execution) with its work and CAS
        directories in DIR; actions run under linux-sandbox with the network blocked, a
        fresh tmpfs on /tmp and on every --hide path, and the rest of the file system
        read-only. --remote_executor=grpc://127.0.0.1:N. Stops on SIGTERM / Ctrl-C.

Debian packages: nginx, bazel-bootstrap-source, a JDK (default-jdk-headless); `make
setup` installs them. Nothing here contacts anything but 127.0.0.1.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"

# Debian's bazel-bootstrap(-source) 4.2.3.
BAZEL_SOURCE = Path(os.environ.get("CUVIL_BAZEL_SOURCE", "/usr/src/bazel-bootstrap"))
WORKER_SOURCES = BAZEL_SOURCE / "src/tools/remote/src/main/java"
BAZEL_SERVER_JAR = Path(os.environ.get("CUVIL_BAZEL_SERVER_JAR", "/usr/share/bazel/A-server.jar"))
LINUX_SANDBOX = Path(os.environ.get("CUVIL_LINUX_SANDBOX", "/usr/share/bazel/linux-sandbox"))
WORKER_MAIN = "com.google.devtools.build.remote.worker.RemoteWorker"

# The worker's gRPC server (and its optional HTTP cache) bind all interfaces: bind them
# to the loopback interface. Each replacement must apply exactly once.
_WORKER_PATCHES = {
    "com/google/devtools/build/remote/worker/RemoteWorker.java": [
        ("NettyServerBuilder.forPort(workerOptions.listenPort)",
         "NettyServerBuilder.forAddress(new java.net.InetSocketAddress("
         "java.net.InetAddress.getLoopbackAddress(), workerOptions.listenPort))"),
        ("b.bind(remoteWorkerOptions.httpListenPort)",
         "b.bind(java.net.InetAddress.getLoopbackAddress(), remoteWorkerOptions.httpListenPort)"),
    ],
}


class RemoteSetupError(RuntimeError):
    """A server or the worker could not be built or started (message says why)."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` (from /proc/net/tcp*):
    e.g. {"127.0.0.1"}; "0.0.0.0" / "::" would mean all interfaces."""
    found = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            rows = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, state = cols[1], cols[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(addr_hex)
            # /proc prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            if width == 8:
                found.add(socket.inet_ntop(socket.AF_INET, raw))
            else:
                addr = socket.inet_ntop(socket.AF_INET6, raw)
                found.add(addr[len("::ffff:"):] if addr.startswith("::ffff:") and "." in addr else addr)
    return found


@dataclass
class Server:
    """A server process this module started (its own session: process group = pid)."""
    name: str
    pid: int
    port: int
    url: str
    log: Path
    proc: subprocess.Popen = field(repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the process, then SIGKILL to its process group (its children:
        nginx's workers, the worker's sandboxed actions) if it has not exited."""
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # leftovers of this server only
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _wait_listening(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise RemoteSetupError(f"{server.name} exited (status {server.proc.returncode}) before "
                                   f"listening on {LOOPBACK}:{server.port}:\n{_tail(server.log)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            if s.connect_ex((LOOPBACK, server.port)) == 0:
                return
        time.sleep(0.2)
    server.stop()
    raise RemoteSetupError(f"{server.name} did not listen on {LOOPBACK}:{server.port} within "
                           f"{timeout:.0f}s:\n{_tail(server.log)}")


def _start(name: str, cmd: list[str], port: int, url: str, log: Path, timeout: float,
           env: dict | None = None) -> Server:
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    server = Server(name=name, pid=proc.pid, port=port, url=url, log=log, proc=proc)
    try:
        _wait_listening(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


# -- nginx: Bazel's HTTP cache protocol ------------------------------------------------

NGINX = os.environ.get("CUVIL_NGINX", "nginx")

_NGINX_CONF = """\
# Generated by tools/remote/cuvil_remote.py: Bazel's HTTP remote cache (GET/PUT of
# /ac/<hash> and /cas/<hash>) on {loopback}:{port}, files under {root}.
daemon off;
master_process on;
worker_processes 1;
{user}pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections 256;
}}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/tmp/client_body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    sendfile on;
    server {{
        listen {loopback}:{port};
        server_name localhost;
        root {root};
        location / {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            client_max_body_size 0;
        }}
    }}
}}
"""


def start_nginx(directory: Path, port: int | None = None, timeout: float = 30.0) -> Server:
    """nginx serving an HTTP cache from directory/cache on 127.0.0.1:port."""
    if shutil.which(NGINX) is None and not Path("/usr/sbin/nginx").exists():
        raise RemoteSetupError("nginx is not installed: run `make setup` (Debian package nginx)")
    nginx = shutil.which(NGINX) or "/usr/sbin/nginx"
    directory = Path(directory).resolve()
    for sub in ("cache", "tmp"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    # Started as root, nginx's workers would drop to `nobody` and fail every PUT into a
    # directory they do not own: keep them as the user who started it.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    conf = directory / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(loopback=LOOPBACK, port=port, dir=directory,
                                       root=directory / "cache", user=user))
    check = subprocess.run([nginx, "-t", "-q", "-p", str(directory), "-e", str(directory / "error.log"),
                            "-c", str(conf)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RemoteSetupError(f"nginx rejected {conf}:\n{check.stderr}")
    return _start("nginx", [nginx, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(conf)],
                  port, f"http://{LOOPBACK}:{port}", directory / "nginx.out", timeout)


# -- the fixed-path interpreter ----------------------------------------------------------

_PTH = "_cuvil_packages.pth"


def make_interpreter(dest: Path, venv: Path = REPO / ".venv") -> Path:
    """DEST/bin/python: a venv over the base interpreter of `venv` whose sys.path has
    `venv`'s site-packages (a .pth file) but not the .pth files in it, so the editable
    install of the compiler is not importable: Cuvil actions must import it from their
    declared sources (PYTHONPATH). Idempotent. Returns the interpreter's path."""
    dest = Path(dest).absolute()
    venv_python = Path(venv) / "bin" / "python"
    if not venv_python.exists():
        raise RemoteSetupError(f"{venv_python} does not exist: run `make setup`")
    probe = subprocess.run(
        [str(venv_python), "-c",
         "import sys, sysconfig\n"
         "p = sysconfig.get_paths()\n"
         "print(sys._base_executable)\n"
         "print(p['purelib']); print(p['platlib'])\n"],
        capture_output=True, text=True, check=True)
    base, *site = probe.stdout.split("\n")[:3]
    site = list(dict.fromkeys(s for s in site if s))
    python = dest / "bin" / "python"
    if not python.exists():
        subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    pth = Path(purelib) / _PTH
    text = "".join(s + "\n" for s in site)
    if not pth.exists() or pth.read_text() != text:
        pth.write_text(text)
    return python


# -- Bazel's REAPI worker -------------------------------------------------------------------

def _worker_key() -> str:
    h = hashlib.sha256()
    for path in sorted(WORKER_SOURCES.rglob("*.java")):
        h.update(str(path.relative_to(WORKER_SOURCES)).encode())
        h.update(path.read_bytes())
    h.update(repr(sorted(_WORKER_PATCHES.items())).encode())
    for f in (BAZEL_SERVER_JAR, LINUX_SANDBOX):
        st = f.stat()
        h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def build_worker(dest: Path) -> Path:
    """Compiles the worker into DEST/classes (idempotent: a stamp keyed on the sources).
    Returns the classes directory (use it with Bazel's server jar on the class path)."""
    dest = Path(dest).resolve()
    for need, pkg in ((WORKER_SOURCES, "bazel-bootstrap-source"), (BAZEL_SERVER_JAR, "bazel-bootstrap"),
                      (LINUX_SANDBOX, "bazel-bootstrap")):
        if not need.exists():
            raise RemoteSetupError(f"{need} does not exist: run `make setup` (Debian package {pkg})")
    if shutil.which("javac") is None:
        raise RemoteSetupError("javac is not installed: run `make setup` (Debian package default-jdk-headless)")
    classes = dest / "classes"
    stamp = dest / f".built-{_worker_key()}"
    if stamp.exists():
        return classes
    shutil.rmtree(dest / "src", ignore_errors=True)
    shutil.rmtree(classes, ignore_errors=True)
    shutil.copytree(WORKER_SOURCES, dest / "src")
    for rel, patches in _WORKER_PATCHES.items():
        path = dest / "src" / rel
        text = path.read_text()
        for old, new in patches:
            if text.count(old) != 1:
                raise RemoteSetupError(f"cannot bind the worker to {LOOPBACK}: {rel} has "
                                       f"{text.count(old)} occurrences of {old!r} (expected 1)")
            text = text.replace(old, new)
        path.write_text(text)
    sources = sorted(str(p) for p in (dest / "src").rglob("*.java"))
    classes.mkdir(parents=True)
    proc = subprocess.run(["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(classes),
                           "-cp", str(BAZEL_SERVER_JAR), *sources], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RemoteSetupError(f"javac failed building the REAPI worker:\n{proc.stderr[-4000:]}")
    # --sandboxing extracts /main/tools/linux-sandbox from its class path.
    (classes / "main" / "tools").mkdir(parents=True)
    shutil.copy2(LINUX_SANDBOX, classes / "main" / "tools" / "linux-sandbox")
    for old in dest.glob(".built-*"):
        old.unlink()
    stamp.touch()
    return classes


def _outermost(paths) -> list[Path]:
    """The paths (resolved, first kept first) minus those inside another one: a checkout
    under /tmp is already hidden by /tmp's tmpfs, and mounting over a path inside an
    empty tmpfs fails ("No such file or directory")."""
    resolved = list(dict.fromkeys(Path(p).resolve() for p in paths))
    return [p for p in resolved if not any(q != p and q in p.parents for q in resolved)]


def start_worker(directory: Path, classes: Path, port: int | None = None, hide: list[Path] = (),
                 jobs: int = 2, timeout: float = 60.0, hide_tmp: bool = True) -> Server:
    """The REAPI worker on 127.0.0.1:port (gRPC: CAS, action cache, execution), its
    work and CAS directories in `directory`. Actions run in linux-sandbox: network
    blocked (own namespace), /tmp and every `hide` path an empty tmpfs, the rest of
    the file system read-only except the action's own directory. `hide_tmp=False`
    leaves /tmp visible (for a client whose interpreter's packages live under /tmp)."""
    directory = Path(directory).resolve()
    work, cas = directory / "work", directory / "cas"
    work.mkdir(parents=True, exist_ok=True)
    cas.mkdir(parents=True, exist_ok=True)
    hidden = (["/tmp"] if hide_tmp else []) + list(hide)
    for path in hidden:
        if directory == Path(path) or Path(path) in directory.parents:
            raise RemoteSetupError(f"the worker's directory {directory} must not be under a hidden path ({path})")
    port = port or free_port()
    cmd = ["java", "-Xmx2g", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
           "-cp", f"{Path(classes).resolve()}:{BAZEL_SERVER_JAR}", WORKER_MAIN,
           f"--listen_port={port}", f"--work_path={work}", f"--cas_path={cas}", f"--jobs={jobs}",
           "--sandboxing", "--sandboxing_block_network"]
    cmd += [f"--sandboxing_tmpfs_dir={p}" for p in _outermost(hidden)]
    server = _start("REAPI worker", cmd, port, f"grpc://{LOOPBACK}:{port}", directory / "worker.log", timeout)
    if "Sandboxing requested, but" in _tail(server.log, 200):
        server.stop()
        raise RemoteSetupError(f"the worker cannot sandbox actions here:\n{_tail(server.log)}")
    return server


# -- command line ------------------------------------------------------------------------------

def _serve(server: Server) -> int:
    print(f"{server.name}: {server.url} (pid {server.pid}, log {server.log}); Ctrl-C stops it", flush=True)
    stop = {"now": False}

    def on_signal(_sig, _frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop["now"] and server.alive():
            time.sleep(0.5)
    finally:
        server.stop()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cuvil_remote.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("interpreter", help="a fixed-path interpreter over .venv's packages")
    s.add_argument("dest", type=Path)
    s.add_argument("--venv", type=Path, default=REPO / ".venv")
    s = sub.add_parser("build-worker", help="compile Bazel's REAPI worker")
    s.add_argument("dest", type=Path)
    s = sub.add_parser("nginx", help="serve an HTTP cache (foreground)")
    s.add_argument("dir", type=Path)
    s.add_argument("--port", type=int)
    s = sub.add_parser("worker", help="run the REAPI worker (foreground)")
    s.add_argument("dir", type=Path)
    s.add_argument("--classes", type=Path, required=True, help="DIR/classes of build-worker")
    s.add_argument("--port", type=int)
    s.add_argument("--hide", type=Path, action="append", default=[], help="an empty tmpfs here in actions")
    s.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    try:
        if args.command == "interpreter":
            print(make_interpreter(args.dest, args.venv))
        elif args.command == "build-worker":
            print(build_worker(args.dest))
        elif args.command == "nginx":
            return _serve(start_nginx(args.dir, args.port))
        else:
            return _serve(start_worker(args.dir, args.classes, args.port, args.hide, args.jobs))
    except RemoteSetupError as e:
        print(f"cuvil_remote.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
