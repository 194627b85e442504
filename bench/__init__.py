"""watchd's benchmarks: ``make bench`` (never timed tests)."""
