"""Auth, producer identity and payload encryption through Queen's real Python client (queen-mq 2.6.0).

Usage: python security.py http://127.0.0.1:PORT MODE ADMIN_TOKEN READ_ONLY_TOKEN
The broker runs with JWT auth (the admin token's sub is "py-admin") and QUEEN_ENCRYPTION_KEY.
MODE picks the client's wire as client_compat.py does (json, binary, compressed). Exits non-zero
on the first failed expectation.
"""
import asyncio
import sys
import uuid

import httpx
from queen import Queen

URL, MODE, ADMIN, READER = sys.argv[1:5]
WIRE = {
    "json": {},
    "binary": {"binary_push": True, "framed_pop": True},
    "compressed": {"binary_push": True, "push_compression": True, "framed_pop": True},
}[MODE]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


async def refused(coro):
    """The HTTP status a call was refused with (None: it was not)."""
    try:
        await coro
    except httpx.HTTPStatusError as e:
        return e.response.status_code
    return None


async def main():
    q = f"secure-{uuid.uuid4().hex[:8]}"
    async with Queen(URL, bearer_token=ADMIN, **WIRE) as queen:
        created = await queen.queue(q).config({"encryptionEnabled": True, "leaseTime": 30}).create()
        check(created["options"]["encryptionEnabled"] is True, "an encrypted queue is configured")
        pushed = await queen.queue(q).push([{"data": {"card": "4111", "i": i}, "producerSub": "mallory"} for i in range(3)])
        check(all(p["status"] == "queued" for p in pushed), "pushes to the encrypted queue are queued")
        msgs = await queen.queue(q).batch(10).wait(False).pop()
        check([m["data"] for m in msgs] == [{"card": "4111", "i": i} for i in range(3)], "pop answers the plaintext, in order")
        check(all(m.get("producerSub") == "py-admin" for m in msgs), "every message carries the token's sub, not the body's")
        res = await queen.ack(msgs, True)
        res = res if isinstance(res, list) else [res]
        check(all(r.get("success") for r in res), "the acks succeed")
        check(await queen.queue(q).batch(10).wait(False).pop() == [], "nothing is left")

    async with Queen(URL, **WIRE) as anonymous:
        check(await refused(anonymous.queue(q).push([{"data": {"x": 1}}])) == 401, "no token: the push is refused with 401")
    async with Queen(URL, bearer_token=READER, **WIRE) as reader:
        check(await refused(reader.queue(q).push([{"data": {"x": 1}}])) == 403, "a read-only token: the push is refused with 403")
        health = (await httpx.AsyncClient(base_url=URL).get("/health")).status_code
        check(health == 200, "/health is public")
    async with Queen(URL, bearer_token=ADMIN, **WIRE) as queen:
        check(await queen.queue(q).batch(10).wait(False).pop() == [], "the refused pushes stored nothing")
        deleted = await queen.queue(q).delete()
        check(deleted.get("deleted") is True, "the admin deletes the queue")
    print("security: all checks passed")


asyncio.run(main())
