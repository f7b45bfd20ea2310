"""What the analysis concludes: the facts the rules read, the engine and deployment settings as evidence, the
findings of ``findings.toml`` merged one per cause with their advice, and one verdict per phase. Imports the
rooms before it (``read/``, ``classify/``, ``steps/``)."""

__all__: list[str] = []
