"""A simulator of Coder's chats API (docs/coder-api.md), every era it describes.

It is the embedded default for ``watchd demo`` and the backbone of the tests.
It is strict where the real server is strict and must never be shaped to
make watchd pass: it imports nothing of the daemon.
"""
