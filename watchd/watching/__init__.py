"""Per-identity watching: seed from a listing, follow the stream, reconcile."""
