"""Notifiers: one per receiver kind. Each answers "did it fail, and is it retryable?"."""
