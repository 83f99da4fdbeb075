"""Diagnoses for the classic PyTorch failures, from real exceptions raised by torch."""

import pytest
import torch

from gradwatch_server.health.diagnose import diagnose


def _raise(fn):
    try:
        fn()
    except Exception as exc:  # we want the real exception object
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize(
    "make, title",
    [
        (lambda: torch.nn.Linear(4, 2)(torch.randn(3, 5)), "Shape mismatch"),
        (lambda: (torch.randn(3, requires_grad=True) * 2).backward(), "backward() called on a non-scalar"),
        (lambda: torch.tensor(1.0).backward(), "The loss is not connected to any parameter"),
    ],
)
def test_real_torch_errors(make, title):
    exc = _raise(make)
    assert diagnose(type(exc).__name__, str(exc))["title"] == title


def test_device_mismatch_and_oom_texts():
    text = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert diagnose("RuntimeError", text)["title"] == "Tensors on different devices"
    oom = diagnose(
        "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", {"memory/cuda_allocated": 2**30}
    )
    assert oom["title"] == "CUDA ran out of memory" and "1024 MiB" in oom["advice"]
    assert diagnose("ValueError", "something else entirely") is None


def test_view_shape_error_is_a_shape_mismatch():
    exc = _raise(lambda: torch.arange(10).view(3, -1))
    assert diagnose(type(exc).__name__, str(exc))["title"] == "Shape mismatch"


def test_hostile_messages_stay_fast():
    import time

    hostile = [
        "shape '" * 200_000,  # many starts for the shape pattern, none closing
        "shape '[1, 2]" + " " * 1_000_000,  # an unterminated quote followed by a megabyte
        "x" * 5_000_000 + " out of memory",  # the tell-tale words past the part that is read
        "\n".join(["expected scalar type"] * 100_000),
    ]
    for message in hostile:
        start = time.perf_counter()
        diagnose("RuntimeError", message)
        assert time.perf_counter() - start < 0.5, message[:40]
    # Only the first MAX_TEXT characters are read: a match buried after them is not looked for.
    assert diagnose("RuntimeError", "x" * 5_000_000 + " out of memory") is None
    assert diagnose("RuntimeError", "CUDA out of memory" + "x" * 5_000_000)["title"] == "CUDA ran out of memory"
