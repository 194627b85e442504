"""Small pieces that know nothing of Coder, chats or alerts (kopf's aiokits)."""
