"""Read and understand profiler traces, in the order of the pipeline; each room imports only the rooms before it.

``read/`` finds trace files and decodes their JSON into columnar tables; ``classify/`` selects the work and names
each row's category and precision role (``taxonomy.toml``); ``steps/`` finds the steps and measures where their
time goes, per rank and phase; ``rules/`` gathers the facts and the deployment's settings, fires the findings and
decides the verdict. Over them, ``analyze`` (traces → one analysis document), ``run`` (the ``analyze`` command
as one function) and ``diff``.
"""
