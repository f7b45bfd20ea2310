"""Read and understand profiler traces: reader, taxonomy, steps, breakdown, ranks, findings, diff."""
