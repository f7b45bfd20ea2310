"""``servescope tune``: measure the knee, try the change the evidence names, keep it only if the knee moves.

:mod:`.loop` runs it (:func:`~servescope.tune.loop.run_tune`); :mod:`.launch` and :mod:`.unit` are the servers it
can restart; :mod:`.journal` is what survives a crash; :mod:`.evidence` gathers what calls for a change;
:mod:`.measure` measures the knee through ``bench serve``'s search.
"""

__all__: list[str] = []
