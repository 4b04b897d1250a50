"""Runs on accelerators: which CUDA devices a study may use, how many runs go at once (``--workers``
counts runs *per device* on CUDA: several training processes share one GPU, each with its own CUDA
context), and how many of them the device's memory holds, from a probe run's reserved peak
(``zfree_lab.run.run_folder.device_memory``). The local executor gives each worker process one device
(``zfree_lab.experiment.executor.local_executor``); the estimate caps the runs per device
(``zfree_lab.experiment.estimate.fit_workers``)."""

from __future__ import annotations

import os

from zfree.core.errors import ConfigError
from zfree_lab.experiment.probe import GB, MEMORY_SHARE, Probe


def cuda_devices() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (its entries
    when set, else "0" .. "n-1"); [] without CUDA. Creates no CUDA context."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (named or [str(i) for i in range(n)])[:n]


def runs_at_once(workers: int, device: str = "auto") -> int:
    """Processes a local study runs at once: ``workers`` runs per CUDA device when its runs go to CUDA
    (``device`` "auto" with CUDA present, or "cuda"; not "cuda:N", which pins one device), else
    ``workers``. Each worker process is given one device (``local_executor``)."""
    n = len(cuda_devices()) if device in ("auto", "cuda") else 0
    return workers * max(1, n)


#: bytes a process's CUDA context and kernels hold on its device beside what the caching allocator
#: reserves (``max_memory_reserved`` does not count them; about 0.5 GB with torch 2.x on an H100/H200)
CUDA_CONTEXT_BYTES = GB // 2


def device_count() -> int:
    """CUDA devices this process may use (``CUDA_VISIBLE_DEVICES`` applied); 0 without CUDA."""
    return len(cuda_devices())


def fit_device(pr: Probe, workers: int, n_devices: int) -> tuple[int, list[str]]:
    """Runs at once on accelerators: ``workers`` is the runs *per device* there, so the grid runs ``workers x n_devices`` processes, each held to what fits beside the others:
    ``floor(MEMORY_SHARE x device_total / (device_peak + CUDA_CONTEXT_BYTES))`` a device, from the probe's
    device peak (``Probe.device_peak``). A probe that ran on the CPU (``device_peak`` 0) or no device:
    ``(workers, [])`` unchanged. Raises ConfigError naming the device memory one run needs when not even
    one fits."""
    if not pr.device_peak or not pr.device_total or n_devices < 1:
        return workers, []
    need = pr.device_peak + CUDA_CONTEXT_BYTES
    per_device = int(MEMORY_SHARE * pr.device_total // need)
    if per_device < 1:
        raise ConfigError(f"one run needs {need / GB:.1f} GB of device memory (its probe reserved "
                          f"{pr.device_peak / GB:.1f} GB + {CUDA_CONTEXT_BYTES / GB:.1f} GB of CUDA context) but the "
                          f"device has {pr.device_total / GB:.1f} GB ({MEMORY_SHARE:.0%} to plan with); use micro_batch, "
                          "precision=bf16 or a smaller batch_size")
    w = min(workers, per_device) * n_devices
    said = (f"device memory: {w} run(s) at once, {w // n_devices} on each of {n_devices} device(s) "
            f"(each run reserves {need / GB:.1f} GB of the device's {pr.device_total / GB:.1f} GB"
            + (f"; {workers} a device asked for, {per_device} fit)" if per_device < workers else ")"))
    return w, [said]
