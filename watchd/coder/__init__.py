"""Talking to Coder: the REST client, the watch stream, and tolerant payload models.

All traffic goes through :mod:`watchd.coder.transport`, the one I/O seam,
which also emits watchd's own ``http:*``/``ws:*`` transport events.
"""
