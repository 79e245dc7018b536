"""Ephemeral queues through Queen's real Python client (queen-mq 2.6.0), `client.ephemeral`:
every verb (configure, reset, delete, push, pop, ack, queues, depth), fan-out to two groups,
competing consumers of one group, a long poll woken by a push, lease expiry with `attempts`
and the `retryLimit` drop, each bound and policy (maxLength and maxBytes under reject and
drop_oldest, ttlSeconds, windowBuffer), commit on delivery, the ack outcomes, and the two 404s.

Usage: python ephemeral.py http://127.0.0.1:PORT[,http://127.0.0.1:PORT2] [declared-queue]
With two brokers the client sends its calls to both in turn (every queue has one owner; the other
forwards), and a pop parked on each broker is woken by a push through the other. With a second
argument it only checks that the queue is declared, as configured, and empty (run after a broker
restart). Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import time
import uuid

from queen import Queen
from queen.errors import EphemeralError, EphemeralQueueNotFoundError

URLS = sys.argv[1].split(",")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def payloads(result):
    return [m["payload"] for m in result["messages"]]


async def verbs_and_fan_out(eph):
    q = name("eph")
    answer = await eph.configure(q, max_length=1000, lease_seconds=30, retry_limit=2)
    check(answer["options"]["maxLength"] == 1000, f"configure answers the resolved options: {answer}")
    pushed = await eph.push(q, [{"n": i} for i in range(5)], partition="p1")
    check(pushed["pushed"] == 5, f"push answers pushed: {pushed}")
    a = await eph.pop(q, group="tail-a", batch=10)
    b = await eph.pop(q, group="tail-b", batch=10)
    check([m["n"] for m in payloads(a)] == list(range(5)), "group tail-a reads all five in order")
    check(payloads(a) == payloads(b), "group tail-b reads the same five (fan-out)")
    check(all(m["attempts"] == 1 and m["partition"] == "p1" for m in a["messages"]), "first delivery: attempts 1")
    acked = await eph.ack(q, a["messages"], group="tail-a")
    check([r["outcome"] for r in acked["results"]] == ["acked"] * 5, f"acks answer acked: {acked}")
    again = await eph.ack(q, a["messages"][:1], group="tail-a")
    check(again["results"][0]["outcome"] == "unknown", "a second ack of the same delivery is unknown")
    wrong_group = await eph.ack(q, b["messages"][:1], group="tail-a")
    check(wrong_group["results"][0]["outcome"] == "unknown", "an ack for another group's delivery is unknown")
    depth = await eph.depth(q)
    groups = {g["group"]: g for g in depth["groups"]}
    check(groups["tail-a"]["pending"] == 0 and groups["tail-b"]["inFlight"] == 5, f"depth's per-group gauges: {depth}")
    listed = await eph.queues()
    check(any(x["queue"] == q for x in listed["queues"]), "queues lists it")
    reset = await eph.reset(q)
    check(reset["dropped"] == 5, f"reset answers what it dropped: {reset}")
    stale = await eph.ack(q, b["messages"][:1], group="tail-b")
    check(stale["results"][0]["outcome"] == "stale", "an ack from before a reset is stale")
    depth = await eph.depth(q)
    check(depth["length"] == 0 and depth["options"]["maxLength"] == 1000, "reset keeps the configuration")
    deleted = await eph.delete(q)
    check(deleted["deleted"] is True, "delete answers deleted:true")
    deleted = await eph.delete(q)
    check(deleted["deleted"] is False, "a second delete answers deleted:false")
    try:
        await eph.depth(q)
        check(False, "depth of a deleted queue raises")
    except EphemeralQueueNotFoundError as e:
        check(e.code == "ephemeral_queue_not_found", "depth of a missing queue: EphemeralQueueNotFoundError")
    reset = await eph.reset(name("never"))
    check(reset["dropped"] == 0, "reset of an unknown queue answers dropped:0")
    q = name("buffered")
    buffered = await eph.push(q, [{"b": i} for i in range(3)], partition="p", buffered={"message_count": 100, "time_millis": 60000})
    check(buffered == {"buffered": True, "count": 3}, f"a buffered push is accepted into the client's buffer: {buffered}")
    await eph.flush(q, partition="p")
    got = await eph.pop(q, partition="p", batch=10)
    check([m["b"] for m in payloads(got)] == [0, 1, 2], "the flushed buffer arrives through the ephemeral push route, in order")


async def competing_consumers(eph):
    q = name("work")
    for p in range(4):
        await eph.push(q, [{"p": p, "i": i} for i in range(3)], partition=f"part-{p}")
    seen = []

    async def worker():
        while True:
            got = await eph.pop(q, group="workers", batch=3)
            if not got["messages"]:
                return
            seen.extend((m["payload"]["p"], m["payload"]["i"]) for m in got["messages"])
            await eph.ack(q, got["messages"], group="workers")

    await asyncio.gather(worker(), worker(), worker())
    check(sorted(seen) == [(p, i) for p in range(4) for i in range(3)], "three consumers of one group share twelve messages, each once")
    for p in range(4):
        order = [i for (pp, i) in seen if pp == p]
        check(order == [0, 1, 2], f"FIFO within part-{p}")
    check((await eph.depth(q))["length"] == 0, "what every group completed is freed")
    await eph.push(q, [1, 2], partition="part-0")
    first = await eph.pop(q, group="g2", partition="part-0", batch=1)
    second = await eph.pop(q, group="g2", partition="part-0", batch=1)
    check(len(first["messages"]) == 1 and second["messages"] == [], "a leased partition is not handed to a second consumer of the group")


async def parked_then_pushed(parked, pusher, q, payload):
    """A pop parked through `parked` (10 s timeout), and a push through `pusher` 0.3 s later:
    what the pop got, and how long it took."""
    started = time.monotonic()

    async def later():
        await asyncio.sleep(0.3)
        await pusher.push(q, [payload])

    got, _ = await asyncio.gather(parked.pop(q, wait=True, timeout=10000), later())
    return got, time.monotonic() - started


async def long_poll(eph):
    q = name("poll")
    await eph.configure(q)
    got, took = await parked_then_pushed(eph, eph, q, {"hello": True})
    check(payloads(got) == [{"hello": True}], "a parked pop gets the push")
    check(took < 5, f"woken by the push, not by its timeout ({took:.2f}s)")
    started = time.monotonic()
    empty = await eph.pop(q, wait=True, timeout=300)
    check(empty["messages"] == [] and time.monotonic() - started >= 0.25, "an unanswered long poll returns empty at its timeout")


async def leases_and_retry_limit(eph):
    q = name("lease")
    await eph.configure(q, lease_seconds=1, retry_limit=1)
    await eph.push(q, [{"job": 1}, {"job": 2}])
    first = await eph.pop(q, group="g", batch=1)
    check(first["messages"][0]["attempts"] == 1, "attempt 1")
    # A waiting pop is woken when the lease runs out, with the message again.
    again = await eph.pop(q, group="g", batch=1, wait=True, timeout=5000)
    check(payloads(again) == [{"job": 1}] and again["messages"][0]["attempts"] == 2, f"redelivered after the lease, attempts 2: {again}")
    late = await eph.ack(q, first["messages"], group="g")
    check(late["results"][0]["outcome"] == "redelivered", "the first delivery's late ack: redelivered")
    retried = await eph.ack(q, [{"id": again["messages"][0]["id"], "status": "retry"}], group="g")
    check(retried["results"][0]["outcome"] == "acked", "a retry ack is taken")
    nxt = await eph.pop(q, group="g", batch=1)
    check(payloads(nxt) == [{"job": 2}], "past retryLimit 1 the message was dropped; the next one comes")
    depth = await eph.depth(q)
    check(depth["dropped"]["retryLimit"] == 1, f"the drop is counted: {depth['dropped']}")
    failed = await eph.ack(q, nxt["messages"], group="g", status=False)
    check(failed["results"][0]["outcome"] == "acked", "failed (status False) is taken")
    back = await eph.pop(q, group="g", batch=1)
    check(payloads(back) == [{"job": 2}] and back["messages"][0]["attempts"] == 2, "a failed message comes back with attempts+1")


async def bounds_and_policies(eph):
    q = name("reject")
    await eph.configure(q, max_length=3, policy="reject")
    await eph.push(q, [1, 2])
    try:
        await eph.push(q, [3, 4])
        check(False, "a push past maxLength under reject is refused")
    except EphemeralError as e:
        check(e.status == 429 and e.code == "ephemeral_queue_full", f"refused with 429 ephemeral_queue_full ({e.status} {e.code})")
    depth = await eph.depth(q)
    check(depth["length"] == 2 and depth["dropped"]["rejected"] == 2, f"nothing of the refused push is stored: {depth}")

    q = name("bytes")
    await eph.configure(q, max_bytes=20, policy="reject")
    await eph.push(q, ["0123456789"])  # 12 bytes of JSON
    try:
        await eph.push(q, ["0123456789"])
        check(False, "a push past maxBytes is refused")
    except EphemeralError as e:
        check(e.status == 429, "maxBytes refuses with 429")

    q = name("feed")
    await eph.configure(q, max_length=3, policy="drop_oldest")
    await eph.push(q, [{"v": 1}], partition="a")
    await eph.push(q, [{"v": 2}], partition="b")
    await eph.push(q, [{"v": 3}, {"v": 4}, {"v": 5}], partition="a")
    depth = await eph.depth(q)
    check(depth["length"] == 3 and depth["dropped"]["evicted"] == 2, f"drop_oldest keeps the bound and counts evictions: {depth}")
    got = await eph.pop(q, partition="a", batch=10, auto_ack=True)
    check(payloads(got) == [{"v": 3}, {"v": 4}, {"v": 5}], "the oldest (v1 in a, v2 in b) went")
    gone = await eph.pop(q, partition="a", batch=10)
    check(gone["messages"] == [], "commit on delivery: nothing comes back")

    q = name("ttl")
    await eph.configure(q, ttl_seconds=1)
    await eph.push(q, ["old"])
    await asyncio.sleep(1.1)
    await eph.push(q, ["new"])
    got = await eph.pop(q, batch=10)
    check(payloads(got) == ["new"], "a message older than ttlSeconds is dropped")

    q = name("window")
    await eph.configure(q, window_buffer={"ms": 400, "count": 3})

    async def trickle():
        for i in range(3):
            await asyncio.sleep(0.05)
            await eph.push(q, [i])

    got, _ = await asyncio.gather(eph.pop(q, batch=10, wait=True, timeout=5000), trickle())
    check(payloads(got) == [0, 1, 2], f"windowBuffer lets a waiting pop fatten its batch: {payloads(got)}")

    try:
        await eph.configure(name("bad"), {"policy": "block"})
        check(False, "an unknown policy is refused")
    except EphemeralError as e:
        check(e.status == 400, "an unknown policy: 400")


async def across_brokers(url_a, url_b):
    """A pop parked through one broker is woken at once by a push through the other, both ways,
    and one group's consumers on the two brokers share one ring."""
    async with Queen(url_a) as qa, Queen(url_b) as qb:
        a, b = qa.ephemeral, qb.ephemeral
        for parked, pusher, label in ((a, b, "a<-b"), (b, a, "b<-a")):
            got, took = await parked_then_pushed(parked, pusher, name("across"), {"via": label})
            check(payloads(got) == [{"via": label}], f"{label}: the push reaches the pop parked on the other broker")
            check(took < 2, f"{label}: at once, not at a timeout ({took:.2f}s)")
        q = name("shared")
        await a.push(q, [{"i": i} for i in range(6)], partition="one")
        first = await a.pop(q, group="g", batch=2)
        second = await b.pop(q, group="g", batch=2)
        check(len(first["messages"]) == 2 and second["messages"] == [], "the partition a consumer on broker a leased is not handed to one on broker b")
        acked = await b.ack(q, first["messages"], group="g")
        check([r["outcome"] for r in acked["results"]] == ["acked", "acked"], "an ack through the other broker finds the delivery")
        rest = await b.pop(q, group="g", batch=10)
        check([m["payload"]["i"] for m in rest["messages"]] == [2, 3, 4, 5], "and the rest comes through broker b, in order")
        depth_a, depth_b = await a.depth(q), await b.depth(q)
        check(depth_a == depth_b, "both brokers answer the same depth (one ring)")


async def declared_after_restart(eph, q):
    depth = await eph.depth(q)
    check(depth["length"] == 0, "after a restart the declared queue is empty")
    check(depth["options"]["maxLength"] == 77 and depth["options"]["policy"] == "drop_oldest", f"and configured as declared: {depth['options']}")
    listed = await eph.queues()
    check(any(x["queue"] == q for x in listed["queues"]), "and listed")


async def main():
    # A 429 (a full queue under reject) is tried once: the client's default backs off and tries
    # ten times, about two minutes.
    many = {"urls": URLS, "load_balancing_strategy": "round-robin"} if len(URLS) > 1 else {"url": URLS[0]}
    async with Queen(retry_429={"max_attempts": 1}, **many) as queen:
        eph = queen.ephemeral
        if len(sys.argv) > 2:
            await declared_after_restart(eph, sys.argv[2])
            print("ephemeral-restart: all checks passed")
            return
        await verbs_and_fan_out(eph)
        await competing_consumers(eph)
        await long_poll(eph)
        await leases_and_retry_limit(eph)
        await bounds_and_policies(eph)
    if len(URLS) > 1:
        await across_brokers(URLS[0], URLS[1])
    print("ephemeral: all checks passed")


asyncio.run(main())
