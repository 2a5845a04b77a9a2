"""Remote execution on Bazel's own REAPI worker (127.0.0.1, linux-sandbox, network
blocked, the client's workspaces hidden): `bazel build --config=remote` of the models
and `bazel test --config=remote` of the C++ app run every action on the worker, none
locally, and give the bytes of the local build."""
from __future__ import annotations

from collections import Counter

from remote_helpers import describe, executed_remotely, output_digests, succeeded

def test_worker_listens_on_loopback_only(remote):
    from cuvil_remote import listening_addresses
    for server in (remote.worker, remote.nginx):
        assert listening_addresses(server.port) == {"127.0.0.1"}, server


def test_models_build_on_the_worker_with_local_bytes(remote_execution, reference_build):
    spawns = remote_execution["build_spawns"]
    counts = Counter(s["mnemonic"] for s in spawns)
    assert counts["CuvilCapture"] == 4 and counts["CuvilCompile"] == 7, counts
    assert counts["CppLink"] > 0 and counts["CppCompile"] > 0, counts
    # Every spawn ran on the worker (the worker's cache was empty): none locally.
    elsewhere = [s for s in spawns if not executed_remotely(s)]
    assert not elsewhere, "not executed by the remote worker:\n" + describe(elsewhere)
    assert all(succeeded(s) for s in spawns)
    # The same bytes as the local build of the first checkout, output by output:
    # captures (.cvir), compiles (.h .o .weights.o .json, C glue), objects, archives,
    # the aarch64 and host executables.
    remote_digests, local = output_digests(spawns), output_digests(reference_build)
    common = sorted(set(remote_digests) & set(local))
    produced = {p for s in spawns for p in s.get("listedOutputs", [])}
    assert set(common) >= {p for p in produced if not p.endswith(".d")}, \
        "outputs of the remote build missing from the local one: " + \
        ", ".join(sorted(produced - set(common)))[:2000]
    different = [p for p in common if remote_digests[p] != local[p]]
    assert not different, "remote and local bytes differ:\n" + "\n".join(different)
    for suffix in ("_capture.cvir", "tiny.o", "tiny.weights.o", "resnet50_aarch64_native", "mobilenetv2_host_native"):
        assert any(p.endswith(suffix) for p in common), suffix


def test_cpp_app_test_passes_on_the_worker(remote_execution, reference_build):
    proc, spawns = remote_execution["test"], remote_execution["test_spawns"]
    assert proc.returncode == 0
    summary = [line for line in (proc.stdout + proc.stderr).splitlines() if "//examples/cpp_app:cpp_app_test" in line]
    assert any("PASSED" in line for line in summary), (proc.stdout + proc.stderr)[-2000:]
    runs = [s for s in spawns if s["mnemonic"] == "TestRunner"]
    assert runs, describe(spawns)
    elsewhere = [s for s in spawns if not executed_remotely(s)]
    assert not elsewhere, "not executed by the remote worker:\n" + describe(elsewhere)
    links = [s for s in spawns if s["mnemonic"] == "CppLink"]
    assert links, describe(spawns)
    local = output_digests(reference_build)
    for path, digest in output_digests(links).items():
        assert local.get(path) == digest, path
