"""The fixture Queen's own client tests (the `tests/` of the queen-mq 2.6.0 sdist) take from a
conftest that the sdist does not ship: `client`, a Queen client of the brokers in QUEEN_URLS
(comma-separated; with several, its calls go to them in turn). Loaded as a pytest plugin
(`-p queen_suite_fixtures`) by server/tests/python_client.rs."""

import os

import pytest_asyncio
from queen import Queen


@pytest_asyncio.fixture
async def client():
    urls = os.environ["QUEEN_URLS"].split(",")
    queen = Queen(urls[0]) if len(urls) == 1 else Queen(urls=urls, load_balancing_strategy="round-robin")
    try:
        yield queen
    finally:
        await queen.close()
