"""Glue for the frameworks and tools pgmemory lives beside; one module per integration.

Each module imports only what its framework needs, and is imported only by its users.
"""
