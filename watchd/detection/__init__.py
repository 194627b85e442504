"""Deciding that a chat is stuck: budgets, timers, diagnosis, and the detector."""
