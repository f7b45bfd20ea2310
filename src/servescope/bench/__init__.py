"""Measurements that feed ``plan``: GEMMs at a model's decode shapes (``gemm``); collectives next.

torch is imported inside the functions that need it (the base install has none; ``servescope[bench]`` adds it).
"""

__all__: list[str] = []
