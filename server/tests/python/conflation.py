"""Conflation (last-value delivery) through Queen's real Python client (queen-mq 2.6.0):
`.conflation()` on pops and on `consume()`, the echo on empty pops (the client raises
ConflationUnsupportedError without it), the stored policy winning over a consumer that declares
the other one, the broker's 400 refusals, and the depth route's `conflation` and
`effectivePending`.

Usage: python conflation.py http://127.0.0.1:PORT
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import uuid

from queen import Queen

URL = sys.argv[1]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def ns(msgs):
    return [m["data"]["n"] for m in msgs]


async def newest_only(queen):
    q = f"conf-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    # A backlog of 100 in one partition, in four pushes (several segments).
    for chunk in range(4):
        await queen.queue(q).partition("task-1").push([{"data": {"n": chunk * 25 + i}} for i in range(25)])
    await queen.queue(q).partition("task-2").push([{"data": {"n": 1000 + i}} for i in range(5)])
    depth = await queen.admin.get_queue_depth(q, "last")
    check(depth["conflation"] is False and depth["effectivePending"] == 105, f"before registration the group is plain: {depth}")
    last = lambda: queen.queue(q).group("last").conflation().batch(10).partitions(10).wait(False)
    msgs = await last().pop()
    check(sorted(ns(msgs)) == [99, 1004], f"one delivery a partition, the newest: {ns(msgs)}")
    check(all(m.get("leaseId") for m in msgs), "leased, to be acked")
    depth = await queen.admin.get_queue_depth(q, "last")
    check(depth["conflation"] is True, "the depth route says the group conflates")
    await queen.ack(msgs, True, {"group": "last"})
    empty = await last().pop()
    check(empty == [], "an empty conflating pop answers (and the client does not raise)")
    await queen.queue(q).partition("task-1").push([{"data": {"n": 100 + i}} for i in range(3)])
    depth = await queen.admin.get_queue_depth(q, "last")
    check(depth["pending"] == 3 and depth["effectivePending"] == 1, f"effectivePending counts partitions: {depth}")
    msgs = await last().pop()
    check(ns(msgs) == [102], f"only the newest of what came since: {ns(msgs)}")
    # Failed: the same newest comes back.
    await queen.ack(msgs[0], False, {"group": "last", "error": "try again"})
    await asyncio.sleep(1.2)  # the queue's default retryDelay (1 s)
    again = await last().pop()
    check(ns(again) == [102], f"a failed newest is delivered again: {ns(again)}")
    await queen.ack(again, True, {"group": "last"})
    # Another group of the same queue is untouched: it reads every message.
    plain = await queen.queue(q).group("audit").batch(200).partitions(10).wait(False).pop()
    check(len(plain) == 108, f"a plain group reads everything: {len(plain)}")


async def stored_policy_wins(queen):
    q = f"conf-stored-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    await queen.queue(q).partition("p").push([{"data": {"n": i}} for i in range(5)])
    # Registered plain by its first pop.
    first = await queen.queue(q).group("g").batch(2).wait(False).pop()
    check(ns(first) == [0, 1], "a plain first registration")
    await queen.ack(first, True, {"group": "g"})
    # A consumer that asks for conflation now: the stored (plain) policy applies, and the
    # client warns instead of raising.
    msgs = await queen.queue(q).group("g").conflation().batch(10).wait(False).pop()
    check(ns(msgs) == [2, 3, 4], f"the stored plain policy wins: {ns(msgs)}")
    await queen.ack(msgs, True, {"group": "g"})
    empty = await queen.queue(q).group("g").conflation().batch(10).wait(False).pop()
    check(empty == [], "an empty pop with a conflict still answers")
    # The other way round: registered conflating, then a consumer that does not ask.
    await queen.queue(q).partition("p").push([{"data": {"n": 5 + i}} for i in range(4)])
    c = await queen.queue(q).group("c").conflation().batch(10).wait(False).pop()
    check(ns(c) == [8], f"registered conflating: {ns(c)}")
    await queen.ack(c, True, {"group": "c"})
    await queen.queue(q).partition("p").push([{"data": {"n": 9 + i}} for i in range(4)])
    plain_ask = await queen.queue(q).group("c").batch(10).wait(False).pop()
    check(ns(plain_ask) == [12], f"a consumer that does not ask still gets the stored policy: {ns(plain_ask)}")
    await queen.ack(plain_ask, True, {"group": "c"})


async def consume_and_long_poll(queen):
    q = f"conf-consume-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    await queen.queue(q).partition("p").push([{"data": {"n": i}} for i in range(50)])
    seen = []

    async def handler(msg):
        seen.append(msg["data"]["n"])

    await queen.queue(q).group("live").conflation().batch(1).wait(False).limit(1).each().consume(handler)
    check(seen == [49], f"consume() with conflation: the newest only: {seen}")

    # A long-poll parked on an idle partition is woken by a push, and gets that push's newest.
    async def later():
        await asyncio.sleep(1.0)
        await queen.queue(q).partition("p").push([{"data": {"n": 100 + i}} for i in range(3)])

    pusher = asyncio.create_task(later())
    msgs = await queen.queue(q).group("live").conflation().batch(10).wait(True).timeout_millis(10000).pop()
    await pusher
    check(ns(msgs) == [102], f"a parked conflating pop is woken with the newest: {ns(msgs)}")
    await queen.ack(msgs, True, {"group": "live"})


async def refusals():
    # The client raises the broker's 400s for a conflating pop instead of returning [].
    async with Queen(URL) as queen:
        q = f"conf-bad-{uuid.uuid4().hex[:8]}"
        await queen.queue(q).create()
        for what, builder in [
            ("without a consumer group", queen.queue(q).conflation().wait(False)),
            ("with commit_on_delivery", queen.queue(q).group("g").conflation().commit_on_delivery().wait(False)),
        ]:
            try:
                await builder.pop()
            except Exception as error:  # the client's HTTP error carries the status
                status = getattr(getattr(error, "response", None), "status_code", None)
                check(status == 400, f"conflation {what} is refused with 400 ({status})")
            else:
                raise AssertionError(f"conflation {what} was accepted")


async def main():
    async with Queen(URL) as queen:
        await newest_only(queen)
        await stored_policy_wins(queen)
        await consume_and_long_poll(queen)
    await refusals()
    print("conflation: all checks passed")


asyncio.run(main())
