"""Text analysis shared by the store and the memory providers (keyword terms)."""
