"""``bench serve``: the load test of a live server, a sweep of load points measured by the client and the server.

:mod:`.sweep` runs the sweep (:class:`~.sweep.LoadSpec` in, a ``ServeResult`` out); each point's requests
live in :mod:`.streams`, shared over worker processes by :mod:`.pool`; :mod:`.bottleneck` judges each point
(client-bound or front-end-bound). Talking to the server (the HTTP client, ``/metrics``, prompts of an exact
length) is :mod:`servescope.server`'s.
"""
