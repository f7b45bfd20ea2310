"""What another parallel layout would cost: model architecture, hardware profiles, collective costs, the planner.

``planner.run_plan`` is the entry point (``servescope plan``); ``cost`` holds the step model, ``weights`` the
byte counting, ``layouts`` the candidates, ``collectives`` the curve / α-β collective times, ``calibrate`` the
fit to a real capture, ``factors`` the assumed constants (``data/plan.toml``).
"""

__all__: list[str] = []
