"""No query string kills a page: every route of the audit page, with every parameter it reads
set to values a careless or hostile client sends, answers a page or a 4xx, never a 500.

What storage would refuse (NUL, lone surrogates, ids too long for an index, garbage cursors and
numbers) must reach the operator as a clear 400, not as a database error.
"""

from __future__ import annotations

import itertools

import httpx
import pytest

from pgmemory.store.store import MemoryStore
from pgmemory.ui import create_app
from tests.ui.conftest import Seeded

ROUTES = [
    "/",
    "/user",
    "/user/memories",
    "/user/memory",
    "/user/recalls",
    "/user/recall",
    "/user/audit",
    "/user/facts",
    "/user/session",
]
#: Every query parameter a page reads.
PARAMETERS = ["user", "collection", "session", "after", "before", "after_seq", "before_seq",
              "limit", "id", "q", "mode"]  # fmt: skip
BAD_VALUES = ["\x00", "s\x00", "\udcff", "x" * 5000, "-1", "99999999999999999999", "%", " ", ""]


@pytest.mark.parametrize("route", ROUTES)
async def test_no_query_value_answers_500(store: MemoryStore, seeded: Seeded, route: str) -> None:
    app = create_app(store, insecure_no_token=True)  # about input, not about the token
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for parameter, value in itertools.product(PARAMETERS, BAD_VALUES):
            params = {"user": seeded.user, "collection": seeded.collection, parameter: value}
            try:
                response = await client.get(route, params=params)
            except UnicodeEncodeError:
                continue  # httpx itself cannot send a lone surrogate: no client can
            assert response.status_code < 500, (route, parameter, repr(value[:20]))
