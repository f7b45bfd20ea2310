"""Kernel names for display: the functions live in :mod:`servescope.core.kernel_names` (the analysis names its
kernels in findings with them too); here for the views that import them from ``report``."""

from __future__ import annotations

from servescope.core.kernel_names import demangle, demangle_all, distinct_kernel_names, shorten_kernel_name

__all__ = ["demangle", "demangle_all", "distinct_kernel_names", "shorten_kernel_name"]
