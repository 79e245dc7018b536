"""The fixture Queen's own client tests (the `tests/` of the queen-mq 2.6.0 sdist) take from a
conftest that the sdist does not ship: `client`, a Queen client of the broker at QUEEN_URL.
Loaded as a pytest plugin (`-p queen_suite_fixtures`) by server/tests/python_client.rs."""

import os

import pytest_asyncio
from queen import Queen


@pytest_asyncio.fixture
async def client():
    queen = Queen(os.environ["QUEEN_URL"])
    try:
        yield queen
    finally:
        await queen.close()
