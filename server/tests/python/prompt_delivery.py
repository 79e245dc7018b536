"""Queen's real Python client (queen-mq 2.6.0) against a broker whose parked pops re-check only
every 60 s: the client's own consume loop and waiting pops long-poll, and a message that becomes
deliverable by time alone (delayedProcessing, a lease expiring) must still reach them at once,
on the queue route and the partition route.

Usage: prompt_delivery.py http://host:port
"""

import asyncio
import sys
import uuid

from queen import Queen

URL = sys.argv[1]
# Far below the broker's 60 s re-check: only a revisit at the right time delivers in time.
DEADLINE_S = 15


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}")
        sys.exit(1)
    print(f"ok: {what}")


def unique(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def consume_one(builder):
    got = []

    async def handler(message):
        got.append(message["data"])

    await asyncio.wait_for(builder.batch(1).limit(1).each().consume(handler), DEADLINE_S)
    return got


async def delayed_message_reaches_the_consume_loop(queen):
    for route in ("queue", "partition"):
        q = unique(f"prompt-delay-{route}")
        await queen.queue(q).config({"delayedProcessing": 2}).create()
        await queen.queue(q).partition("p").push([{"data": {"route": route}}])
        builder = queen.queue(q) if route == "queue" else queen.queue(q).partition("p")
        got = await consume_one(builder)
        check(got == [{"route": route}], f"delayedProcessing: the {route}-route consume loop gets the message when it matures")


async def expired_lease_reaches_a_waiting_pop(queen):
    for route in ("queue", "partition"):
        q = unique(f"prompt-lease-{route}")
        await queen.queue(q).config({"leaseTime": 2}).create()
        await queen.queue(q).partition("p").push([{"data": {"route": route}}])
        taken = await queen.queue(q).batch(1).wait(False).pop()
        check(len(taken) == 1, "a consumer takes the message and dies without acking")
        builder = queen.queue(q) if route == "queue" else queen.queue(q).partition("p")
        msgs = await asyncio.wait_for(builder.batch(1).wait(True).pop(), DEADLINE_S)
        check([m["data"] for m in msgs] == [{"route": route}], f"lease expiry: a waiting {route}-route pop gets the message back")
        await queen.ack(msgs, True)


async def main():
    async with Queen(URL) as queen:
        await delayed_message_reaches_the_consume_loop(queen)
        await expired_lease_reaches_a_waiting_pop(queen)
    print("prompt delivery: all checks passed")


asyncio.run(main())
