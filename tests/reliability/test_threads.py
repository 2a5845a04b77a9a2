"""One CompiledModel called from many Python threads at once (issue 33): every result is
bit-identical to the same call made on one thread, and no call fails.

A symbolic-batch MLP (each thread uses its own batch sizes, so the runs' shapes differ
all the time) and a static two-conv CNN (every call contends for the same model)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import cuvil

THREADS, CALLS = 4, 200


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(24, 48), torch.nn.Linear(48, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TwoConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 3, stride=2)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


def _hammer(model, inputs: list[tuple[np.ndarray, ...]]) -> tuple[list, list]:
    """THREADS threads, each calling `model` on its share of `inputs` in turn; the
    results by input index, and every exception raised."""
    results: list = [None] * len(inputs)
    errors: list = []
    start = threading.Barrier(THREADS)

    def work(k: int) -> None:
        start.wait()
        for i in range(k, len(inputs), THREADS):
            try:
                results[i] = model(*inputs[i])
            except Exception as e:  # noqa: BLE001 - every error is a failure of the test
                errors.append(f"call {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _check(model, inputs, reference_module) -> None:
    serial = [model(*xs) for xs in inputs]  # single-threaded, the reference
    with torch.no_grad():  # and the serial results are right, not merely repeatable
        for xs, got in zip(inputs[:8], serial):
            want = reference_module(*(torch.from_numpy(x) for x in xs)).numpy()
            np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
    results, errors = _hammer(model, inputs)
    assert errors == []
    wrong = [i for i, (a, b) in enumerate(zip(serial, results))
             if b is None or a[0].shape != b[0].shape or a[0].tobytes() != b[0].tobytes()]
    assert wrong == [], f"{len(wrong)} of {len(inputs)} results differ from the single-threaded ones"


@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_batch_mlp_from_four_threads(threads):
    torch.manual_seed(0)
    module = MLP().eval()
    model = cuvil.compile(module, (torch.randn(2, 24),), dynamic_shapes=[("batch", None)],
                          dim_bounds={"batch": (1, 8)}, threads=threads)
    rng = np.random.default_rng(1)
    # batch sizes 1..8 interleaved so that concurrent calls have different shapes
    inputs = [(rng.standard_normal((1 + (i * 5) % 8, 24)).astype(np.float32),) for i in range(THREADS * CALLS)]
    _check(model, inputs, module)


def test_static_cnn_from_four_threads():
    torch.manual_seed(2)
    module = TwoConv().eval()
    model = cuvil.compile(module, (torch.randn(1, 3, 48, 48),))
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal((1, 3, 48, 48)).astype(np.float32),) for _ in range(THREADS * CALLS)]
    _check(model, inputs, module)


def test_set_threads_between_concurrent_calls():
    """set_threads from one thread while others call: no error, same numbers."""
    torch.manual_seed(4)
    module = TwoConv().eval()
    model = cuvil.compile(module, (torch.randn(1, 3, 48, 48),))
    x = np.random.default_rng(5).standard_normal((1, 3, 48, 48)).astype(np.float32)
    want = model(x)[0].tobytes()
    stop = threading.Event()

    def flip():
        n = 0
        while not stop.is_set():
            model.set_threads(1 + n % 2)
            n += 1

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        results, errors = _hammer(model, [(x,)] * 200)
    finally:
        stop.set()
        flipper.join()
    assert errors == []
    assert all(r[0].tobytes() == want for r in results)
