"""Transport events (the seam) and their conversion into OpenTelemetry spans."""
