"""watchd: a monitoring daemon for fleets of Coder Agents chats."""

__version__ = "0.1.0"
