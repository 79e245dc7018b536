"""An exactly-once pipeline through Queen's real Python client (queen-mq 2.6.0), on two brokers
whose PostgreSQL the calling test stops and starts while it runs (server/tests/faults.rs).

Each source message is handled in one transaction: `once` (a marker keyed by the message), the
ack of the source message, a push to the destination queue, a KV increment and a timer. A
commit that fails (the outage) is sent again; the marker makes a commit that landed but was
not answered come back as `kv_precondition`, never a second application.

Checks: the destination, read by offset, holds every source message exactly once (its pushes
carry no transactionId, so a second application would show); the counter equals the number of
messages; every timer fired; the source group has nothing left; and some commit met the outage.

Usage: python pipeline.py URL_A URL_B MESSAGES
Prints "pipeline: pushed" once the source is filled (the test's cue to stop PostgreSQL).
"""
import asyncio
import collections
import sys
import time
import uuid

from queen import Queen

URLS = sys.argv[1:3]
N = int(sys.argv[3])
RUN = uuid.uuid4().hex[:6]
SOURCE, DEST, TIMERS, NS = f"pipe-src-{RUN}", f"pipe-dst-{RUN}", f"pipe-tim-{RUN}", f"pipe-{RUN}"
PARTITIONS = [f"p{i}" for i in range(4)]
stats = collections.Counter()
handled = set()
fired = collections.Counter()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}", flush=True)


async def handle(queen, msg):
    tx, partition = msg["data"]["tx"], msg["data"]["p"]
    for _ in range(100):
        try:
            bundle = (
                queen.transaction()
                .once(NS, f"done-{tx}", forever=True)
                .ack(msg, "completed", {"consumer_group": "pipe"})
                .queue(DEST)
                .partition(partition)
                .push([{"data": {"tx": tx}}])
                .kv.incr(NS, "count", forever=True)
                .timer(TIMERS)
                .key(f"t-{tx}")
                .payload({"tx": tx})
                .after_ms(200)
                .schedule()
            )
            result = await bundle.commit()
            stats["committed" if result.get("success") else f"not applied: {result.get('reason')}"] += 1
            handled.add(tx)
            return
        except Exception:  # the outage: sent again after a pause
            stats["failed commits"] += 1
            await asyncio.sleep(0.2)
    raise AssertionError(f"{tx}: no commit answered in 100 tries")


async def worker(queen, done):
    while not done.is_set():
        try:
            msgs = await queen.queue(SOURCE).group("pipe").batch(5).wait(True).timeout_millis(500).pop()
        except Exception:
            stats["failed pops"] += 1
            await asyncio.sleep(0.1)
            continue
        for m in msgs or []:
            await handle(queen, m)
            # Slow enough that the outage lands mid-run.
            await asyncio.sleep(0.01)


async def timer_consumer(queen, done):
    while not done.is_set():
        try:
            msgs = await queen.queue(TIMERS).group("t").batch(50).wait(True).timeout_millis(500).pop()
        except Exception:
            await asyncio.sleep(0.1)
            continue
        for m in msgs or []:
            fired[m["data"]["tx"]] += 1
        if msgs:
            await queen.ack(msgs, True, {"group": "t"})


async def main():
    clients = [Queen(url=u, retry_attempts=3, retry_delay_millis=200) for u in URLS]
    a = clients[0]
    await a.queue(SOURCE).config({"leaseTime": 30}).create()
    await a.queue(DEST).create()
    await a.queue(TIMERS).config({"leaseTime": 10}).create()
    by_partition = collections.defaultdict(list)
    for j in range(N):
        p = PARTITIONS[j % len(PARTITIONS)]
        by_partition[p].append({"data": {"tx": f"m{j}", "p": p}, "transactionId": f"m{j}"})
    for p, items in by_partition.items():
        for i in range(0, len(items), 100):
            await a.queue(SOURCE).partition(p).push(items[i : i + 100])
    print("pipeline: pushed", flush=True)
    done = asyncio.Event()
    tasks = [asyncio.create_task(worker(clients[i % 2], done)) for i in range(4)]
    timers = asyncio.create_task(timer_consumer(clients[1], done))
    want = {f"m{j}" for j in range(N)}
    deadline = time.monotonic() + 120
    while (handled != want or set(fired) != want) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    done.set()
    await asyncio.gather(*tasks, timers)
    print(f"stats {dict(stats)}", flush=True)

    check(handled == want, f"every source message handled ({len(handled)} of {N})")
    read = await clients[1].queue(DEST).fetch(PARTITIONS)
    got = collections.Counter(r["payload"]["tx"] for part in read.values() for r in part["records"])
    twice = {k: v for k, v in got.items() if v > 1}
    check(set(got) == want, f"the destination holds every message ({len(got)} of {N})")
    check(not twice, f"and none twice ({list(twice.items())[:5]})")
    count = await a.kv.get(NS, "count")
    check(count and count["value"] == N, f"the counter counted each message once ({count and count['value']})")
    check(set(fired) == want, f"every timer fired ({len(fired)} of {N})")
    left = await a.queue(SOURCE).group("pipe").batch(10).wait(False).pop()
    check(not left, "the source group has nothing left")
    check(stats["failed commits"] > 0, "some commit met the outage")
    for c in clients:
        await c.close()
    print("pipeline: all checks passed", flush=True)


asyncio.run(main())
