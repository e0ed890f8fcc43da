"""Where the demo's model steps run: the simulated GPU, or a real one.

By default (``--gpu auto``) the model runs on the simulated GPU that
``instrument(gpu="simulated")`` samples: a model step keeps it at 100% for
the step's duration. Only when NVML finds an NVIDIA GPU and torch can use
CUDA does the demo run real matrix multiplications there instead, sized
to take about as long, with ``instrument()`` sampling that GPU through
NVML. Everything else in the demo is the same on both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Optional

from agent_otel.errors import ConfigError
from agent_otel.semconv import GPU_SOURCE_NVML, GPU_SOURCE_SIMULATED

CHOICES = ("auto", GPU_SOURCE_SIMULATED, "real")
MATMUL_SIZE = 4096
CALIBRATION_S = 0.5


@dataclass
class GpuChoice:
    """The GPU the demo uses, why, and the ``instrument()`` settings that sample it."""

    kind: str  # "simulated" or "real"
    reason: str
    settings: dict = field(default_factory=dict)
    real: Optional["TorchGpu"] = None

    def describe(self, name: str) -> str:
        return f"{name} ({self.reason})"


def choose(requested: str) -> GpuChoice:
    """Pick the GPU for ``--gpu``: ``simulated``, ``real`` (or an error), or ``auto``."""
    if requested not in CHOICES:
        raise ConfigError("--gpu", requested, " or ".join(CHOICES))
    if requested == GPU_SOURCE_SIMULATED:
        return GpuChoice(GPU_SOURCE_SIMULATED, f"--gpu {GPU_SOURCE_SIMULATED}", {"gpu": GPU_SOURCE_SIMULATED})
    problem = _real_gpu_problem()
    if problem is None:
        real = TorchGpu()
        return GpuChoice(
            "real",
            "real GPU: model steps are torch matmuls, sampled through NVML",
            {"gpu": GPU_SOURCE_NVML, "gpu_devices": (real.nvml_id,)},
            real,
        )
    if requested == "real":
        raise ConfigError("--gpu", requested, f"a machine where the demo can use an NVIDIA GPU ({problem})")
    return GpuChoice(GPU_SOURCE_SIMULATED, problem, {"gpu": GPU_SOURCE_SIMULATED})


def _real_gpu_problem() -> Optional[str]:
    """None when NVML sees a GPU and torch can use CUDA; otherwise why not."""
    from agent_otel.gpu.nvml import NvmlSource

    source = NvmlSource(quiet=True)
    found = bool(source.devices())
    source.close()
    if not found:
        return "no NVIDIA GPU found"
    try:
        import torch
    except ImportError:
        return "an NVIDIA GPU is present, but torch is not installed"
    if not torch.cuda.is_available():
        return "an NVIDIA GPU is present, but torch cannot use CUDA"
    return None


class TorchGpu:
    """Model steps as fp16 matmuls on CUDA device 0, timed to the requested seconds."""

    def __init__(self):
        import torch

        logging.getLogger("agent_otel").info("calibrating matmuls on %s", torch.cuda.get_device_name(0))
        self.torch = torch
        device = torch.device("cuda", 0)
        self.a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.float16)
        self.b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.float16)
        self.out = torch.empty_like(self.a)
        uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
        # NVML names GPUs by physical index; a UUID is right whatever CUDA_VISIBLE_DEVICES says.
        self.nvml_id = f"GPU-{uuid}" if uuid is not None else "0"
        self.matmul_s = 1.0
        self.run_kernel(0.0)  # warm up cuBLAS
        started, count = time.perf_counter(), 0
        while time.perf_counter() - started < CALIBRATION_S:
            self._matmuls(10)
            count += 10
        self.matmul_s = (time.perf_counter() - started) / count

    def _matmuls(self, count: int) -> None:
        for _ in range(count):
            self.torch.mm(self.a, self.b, out=self.out)
        self.torch.cuda.synchronize()

    def run_kernel(self, seconds: float) -> None:
        """Keep the GPU busy for about ``seconds``, then return (like a synchronous model step)."""
        self._matmuls(max(1, round(seconds / self.matmul_s)))
