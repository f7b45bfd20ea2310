"""The work of a trace and what each piece of it is: what launched it, its category (``taxonomy.toml``) and the
evidence that decided, and its precision role. Imports ``read/`` only."""

__all__: list[str] = []
