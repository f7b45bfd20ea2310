"""servescope: where a decode step's time goes on multi-GPU LLM servers, and what to change."""

__all__ = ["__version__"]

# The one place the version lives; pyproject.toml reads it (importlib.metadata costs ~80 ms at start-up).
__version__ = "0.1.0"
