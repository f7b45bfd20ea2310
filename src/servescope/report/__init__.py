"""Views of result documents: terminal tables (rich), JSON and self-contained HTML. Views never recompute."""

__all__: list[str] = []
