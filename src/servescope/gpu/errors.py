"""GPU errors a user can act on: no GPU stack here, or a query that failed."""

from __future__ import annotations

from servescope.core.errors import ServescopeError

__all__ = ["GpuQueryError", "GpuUnavailable"]


class GpuUnavailable(ServescopeError):
    """No way to ask the GPUs here: nvidia-ml-py, the NVML library, the driver or nvidia-smi is missing."""


class GpuQueryError(ServescopeError):
    """A GPU query that should have worked failed (an NVML error other than "not supported",
    nvidia-smi exiting non-zero or printing what we cannot read)."""
