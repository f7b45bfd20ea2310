"""Planned: see ../shared/DESIGN.md for this package's role."""
