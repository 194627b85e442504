"""Alerts: the record, the sink seam, matchers, and (later) routing and receivers."""
