"""What watchd knows about chats: compact records, and their persistence on disk."""
