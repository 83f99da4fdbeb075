"""Diagnoses for the classic PyTorch failures, from real exceptions raised by torch."""

import pytest
import torch

from gradwatch_server.diagnose import diagnose


def _raise(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - we want the real exception object
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize("make, title", [
    (lambda: torch.nn.Linear(4, 2)(torch.randn(3, 5)), "Shape mismatch"),
    (lambda: (torch.randn(3, requires_grad=True) * 2).backward(), "backward() called on a non-scalar"),
    (lambda: torch.tensor(1.0).backward(), "The loss is not connected to any parameter"),
])
def test_real_torch_errors(make, title):
    exc = _raise(make)
    assert diagnose(type(exc).__name__, str(exc))["title"] == title


def test_device_mismatch_and_oom_texts():
    text = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert diagnose("RuntimeError", text)["title"] == "Tensors on different devices"
    oom = diagnose("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB",
                   {"memory/cuda_allocated": 2**30})
    assert oom["title"] == "CUDA ran out of memory" and "1024 MiB" in oom["advice"]
    assert diagnose("ValueError", "something else entirely") is None
