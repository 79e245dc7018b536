"""Drives a running broker through Queen's real Python client (queen-mq 2.6.0), unchanged.

Usage: python client_compat.py http://127.0.0.1:PORT
Exits non-zero with a message on the first failed expectation.
"""
import asyncio
import sys
import uuid

import httpx
from queen import Queen

URL = sys.argv[1]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def unique(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def configure_push_duplicate(queen):
    q = unique("compat-push")
    created = await queen.queue(q).config({"leaseTime": 30, "retryLimit": 2}).create()
    check(created.get("configured") is True, "configure answers configured: true")
    check(created["options"]["leaseTime"] == 30, "configure echoes the options")
    first = await queen.queue(q).push([{"data": {"n": 1}, "transactionId": "tx-1"}])
    check(first[0]["status"] == "queued", "push is queued")
    again = await queen.queue(q).push([{"data": {"n": 1}, "transactionId": "tx-1"}])
    check(again[0]["status"] == "duplicate", "a second push of the same transactionId is a duplicate")
    check(again[0]["message_id"] == first[0]["message_id"], "the duplicate answers the original message_id")
    other = await queen.queue(q).partition("p2").push([{"data": {"n": 1}, "transactionId": "tx-1"}])
    check(other[0]["status"] == "queued", "the same transactionId on another partition is new")
    msgs = await queen.queue(q).batch(10).wait(False).pop()
    check(len(msgs) == 1 and msgs[0]["data"] == {"n": 1}, "pop returns the pushed payload")
    res = await queen.ack(msgs[0], True)
    check(res.get("success") is True, "ack succeeds")
    deleted = await queen.queue(q).delete()
    check(deleted.get("deleted") is True, "delete queue")


async def pop_with_wait(queen):
    q = unique("compat-wait")
    await queen.queue(q).create()

    async def late_push():
        await asyncio.sleep(1.0)
        await queen.queue(q).push([{"data": {"late": True}}])

    pusher = asyncio.create_task(late_push())
    msgs = await queen.queue(q).batch(1).wait(True).timeout_millis(10000).pop()
    await pusher
    check(len(msgs) == 1 and msgs[0]["data"] == {"late": True}, "a waiting pop receives a message pushed during the wait")
    empty = await queen.queue(q).batch(1).wait(False).pop()
    check(empty == [], "an empty pop returns [] (204)")


async def renew_and_batch_ack(queen):
    q = unique("compat-renew")
    await queen.queue(q).config({"leaseTime": 2}).create()
    for p in ("a", "b", "c"):
        await queen.queue(q).partition(p).push([{"data": {"p": p}}])
    msgs = await queen.queue(q).batch(10).partitions(3).wait(False).pop()
    check(len(msgs) == 3, "a multi-partition pop takes all three partitions")
    check(len({m["partitionId"] for m in msgs}) == 3 and len({m["leaseId"] for m in msgs}) == 1, "three partitions, one lease")
    renewed = await queen.renew(msgs)
    renewed = renewed if isinstance(renewed, list) else [renewed]
    check(all(r.get("success") for r in renewed), "renew succeeds")
    await asyncio.sleep(3)  # past the original 2 s lease: only the renewal keeps it
    res = await queen.ack(msgs, True)
    check(res.get("success") is True, "a batch ack after renewing past the lease time succeeds")
    again = await queen.queue(q).batch(10).partitions(3).wait(False).pop()
    check(again == [], "acked messages are not redelivered")


async def consume_single_ack(queen):
    q = unique("compat-consume")
    await queen.queue(q).create()
    await queen.queue(q).push([{"data": {"i": i}} for i in range(3)])
    seen = []

    async def handler(message):
        seen.append(message["data"]["i"])

    await queen.queue(q).batch(1).wait(False).limit(3).each().consume(handler)
    check(seen == [0, 1, 2], f"consume() delivers in order and acks each ({seen})")
    rest = await queen.queue(q).batch(10).wait(False).pop()
    check(rest == [], "consume() acked what it processed")


async def groups_and_subscription_modes(queen):
    q = unique("compat-groups")
    await queen.queue(q).create()
    await queen.queue(q).push([{"data": {"old": i}} for i in range(5)])
    all_msgs = await queen.queue(q).group("g-all").subscription_mode("all").batch(10).wait(False).pop()
    check(len(all_msgs) == 5, "group with mode all sees the history")
    await queen.ack(all_msgs, True, {"group": "g-all"})
    new_msgs = await queen.queue(q).group("g-new").subscription_mode("new").batch(10).wait(False).pop()
    check(new_msgs == [], "group with mode new skips the history")
    await queen.queue(q).push([{"data": {"new": i}} for i in range(3)])
    a = await queen.queue(q).group("g-all").batch(10).wait(False).pop()
    n = await queen.queue(q).group("g-new").batch(10).wait(False).pop()
    check(len(a) == 3 and len(n) == 3, "both groups get exactly the 3 new messages")
    res = await queen.ack(n, True, {"group": "g-new"})
    check(res.get("success") is True, "ack with the group")
    queue_mode = await queen.queue(q).batch(100).wait(False).pop()
    check(len(queue_mode) == 8, "queue mode is independent of the groups")


async def commit_on_delivery(queen):
    q = unique("compat-autoack")
    await queen.queue(q).create()
    await queen.queue(q).push([{"data": {"x": 1}}])
    msgs = await queen.queue(q).group("g").batch(10).wait(False).commit_on_delivery().pop()
    check(len(msgs) == 1 and msgs[0]["leaseId"] == "", "commit_on_delivery: delivered with an empty leaseId")
    again = await queen.queue(q).group("g").batch(10).wait(False).pop()
    check(again == [], "commit_on_delivery committed at delivery")


async def js_pop_shape():
    # js 0.15: client.queue(q).batch(1).wait(true).pop() sends batch, wait, timeout first.
    q = unique("compat-js")
    async with httpx.AsyncClient(base_url=URL, timeout=20) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": {"js": 1}}]})
        check(r.status_code == 201, "raw JSON push answers 201")
        r = await http.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "wait": "true", "timeout": 5000}, headers={"Content-Type": "application/json"})
        check(r.status_code == 200, "js-shaped pop answers 200")
        body = r.json()
        m = body["messages"][0]
        check(body["success"] is True and m["data"] == {"js": 1} and m["partitionId"] and m["leaseId"], "js-shaped answer")
        r = await http.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "wait": "false"})
        check(r.status_code == 204 and r.content == b"", "an empty pop is 204 with no body")


async def main():
    async with Queen(URL) as queen:
        await configure_push_duplicate(queen)
        await pop_with_wait(queen)
        await renew_and_batch_ack(queen)
        await consume_single_ack(queen)
        await groups_and_subscription_modes(queen)
        await commit_on_delivery(queen)
    await js_pop_shape()
    print("client compatibility: all checks passed")


asyncio.run(main())
