"""The steps of a trace (by the formats of ``steps.toml``) and where their time goes: the breakdown per rank and
phase, each step's measures, the collectives, the ranks compared. Imports ``read/`` and ``classify/``."""

__all__: list[str] = []
