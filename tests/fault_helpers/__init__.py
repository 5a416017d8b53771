"""Scripts the fault tests run as separate processes (writers, streaming queries, probes)."""
