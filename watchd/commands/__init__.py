"""The sub-commands of ``watchd``, one module each, imported only when that command runs."""
