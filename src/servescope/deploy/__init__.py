"""The service as data: unit files (systemd syntax, drop-ins), the spec, render, lint, import, systemctl,
lifecycle (stop, wait for GPU memory, start, wait ready), settings and drift."""
