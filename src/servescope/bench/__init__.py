"""Measurements: GEMMs at a model's decode shapes (``gemm``) and collective curves (``comm``) that feed ``plan``,
decode captures (``capture_decode``), and the load test of a live server (``serve``).

torch is imported inside the functions that need it (the base install has none; ``servescope[bench]`` adds it).
"""

__all__: list[str] = []
