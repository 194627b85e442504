"""What watchd knows about chats: compact records and their table, and the state file
(:mod:`watchd.store.sqlite`) in which every owner keeps its own tables."""
