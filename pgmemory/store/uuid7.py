"""Time-ordered UUIDs (RFC 9562 version 7) for memory ids.

Python 3.11 has no ``uuid.uuid7``; ids made here sort by creation time, which keeps the
primary-key index append-mostly and makes ids readable in audits.
"""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A new version-7 UUID: 48-bit Unix milliseconds, then 74 random bits."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return uuid.UUID(int=value)
