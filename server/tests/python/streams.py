"""Streams end to end through Queen's real Python client (queen-mq 2.6.0, `queen.streams`):
a tumbling-window sum, a token-bucket gate (the partial-ack cycle that keeps its lease), a worker
killed mid-run whose replacement resumes from the committed state with nothing counted twice,
a changed config_hash (409 unless reset, its error saying "config_hash mismatch"), and the raw
routes' answers and refusals. Windows are emitted once when cycles race: two flush cycles that
close one window, sent at once (one commits, the other is refused whole with 409), a flush while
a worker holds the source lease (409), and two SDK workers of one sliding-window query whose idle
flushes race (every event counted exactly twice at the sink, once per window it is in).

Usage: python streams.py http://127.0.0.1:PORT
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import uuid

import httpx
from queen import Queen, Stream, token_bucket_gate
from queen.streams.runtime.register import StreamsConfigHashMismatch

URL = sys.argv[1]
WINDOW_MS = 1000
# Event times far from now, so windows close by the partition's watermark (event time), not by
# the wall clock: what the test sees does not depend on the machine's speed.
BASE_MS = 1_700_000_000_000


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


async def drain(queen, queue, group, want, seconds=20):
    """Every message of `queue` for `group` until `want` arrived (or time ran out)."""
    got = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while len(got) < want and loop.time() < end:
        msgs = await queen.queue(queue).group(group).batch(100).wait(True).timeout_millis(1000).pop()
        if msgs:
            got.extend(m["data"] for m in msgs)
            await queen.ack(msgs, True, {"group": group})
    return got


def event(window, value, source_tx):
    return {"data": {"ts": BASE_MS + window * WINDOW_MS + 10, "v": value}, "transactionId": source_tx}


def summing(queen, src, sink):
    return (
        Stream.from_(queen.queue(src))
        .window_tumbling(seconds=WINDOW_MS / 1000, event_time=lambda m: (m.get("data") or m)["ts"], idle_flush_ms=200)
        .reduce(lambda acc, m: {"sum": acc["sum"] + m["v"], "n": acc["n"] + 1}, {"sum": 0, "n": 0})
        .to(queen.queue(sink))
    )


async def tumbling_sum(queen):
    src, sink = f"st-src-{uuid.uuid4().hex[:8]}", f"st-sink-{uuid.uuid4().hex[:8]}"
    await queen.queue(src).create()
    await queen.queue(sink).create()
    # Windows 0..3 with sums 10, 20, 30, 40 (four events each); an event in window 9 closes them.
    items = [event(w, (w + 1) * 10 // 4, f"e-{w}-{i}") for w in range(4) for i in range(4)]
    await queen.queue(src).partition("p").push(items)
    await queen.queue(src).partition("p").push([event(9, 1, "late-closer")])
    runner = await summing(queen, src, sink).run(query_id=f"sum-{src}", url=URL, batch_size=5, max_wait_millis=500)
    try:
        out = await drain(queen, sink, "check", 4)
    finally:
        await runner.stop()
    sums = sorted((o["sum"], o["n"]) for o in out)
    check(sums == [(8, 4), (20, 4), (28, 4), (40, 4)], f"one sum per closed window, each once ({sums})")
    check(runner.metrics()["cyclesTotal"] >= 1, "cycles committed")


async def gate(queen):
    src, sink = f"st-gsrc-{uuid.uuid4().hex[:8]}", f"st-gsink-{uuid.uuid4().hex[:8]}"
    # A short lease: the gate's denied tail waits for it to end, then comes back in order.
    await queen.queue(src).config({"leaseTime": 2}).create()
    await queen.queue(sink).create()
    await queen.queue(src).partition("p").push([{"data": {"n": i}, "transactionId": f"g-{i}"} for i in range(12)])
    stream = Stream.from_(queen.queue(src)).gate(token_bucket_gate(capacity=4, refill_per_sec=4)).to(queen.queue(sink))
    runner = await stream.run(query_id=f"gate-{src}", url=URL, batch_size=12, max_wait_millis=500)
    try:
        out = await drain(queen, sink, "check", 12, seconds=30)
    finally:
        await runner.stop()
    check([o["n"] for o in out] == list(range(12)), f"every message through the gate once, in order ({[o['n'] for o in out]})")
    check(runner.metrics().get("gateDenialsTotal", 0) > 0, "the bucket denied some (the lease-keeping partial cycles ran)")


async def killed_worker(queen):
    src, sink = f"st-ksrc-{uuid.uuid4().hex[:8]}", f"st-ksink-{uuid.uuid4().hex[:8]}"
    await queen.queue(src).config({"leaseTime": 2}).create()
    await queen.queue(sink).create()
    query = f"kill-{src}"
    await queen.queue(src).partition("p").push([event(0, 1, f"k-{i}") for i in range(40)])
    first = await summing(queen, src, sink).run(query_id=query, url=URL, batch_size=3, max_wait_millis=200)
    for _ in range(1000):
        if first.metrics()["cyclesTotal"] >= 3:
            break
        await asyncio.sleep(0.02)
    # Killed, not stopped: its loop is cancelled wherever it is, a cycle possibly in flight.
    first._stopped = True
    for task in (first._loop_task, first._flush_task):
        if task:
            task.cancel()
    await asyncio.gather(*(t for t in (first._loop_task, first._flush_task) if t), return_exceptions=True)
    done = first.metrics()["cyclesTotal"]
    check(0 < done, f"the first worker committed some cycles before it died ({done})")
    second = await summing(queen, src, sink).run(query_id=query, url=URL, batch_size=10, max_wait_millis=500)
    try:
        await queen.queue(src).partition("p").push([event(5, 0, "k-closer")])
        out = await drain(queen, sink, "check", 1)
        await asyncio.sleep(1.0)
        out += await drain(queen, sink, "check", 1, seconds=1)
    finally:
        await second.stop()
    check([o["n"] for o in out] == [40] and out[0]["sum"] == 40, f"the replacement resumed from the committed state: every event counted once ({out})")


async def registration_and_routes():
    name = f"reg-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=URL) as http:
        body = {"name": name, "source_queue": "reg-src", "config_hash": "h1", "reset": False}
        r = await http.post("/streams/v1/queries", json=body)
        first = r.json()
        check(r.status_code == 200 and first["fresh"] is True and first["reset"] is False, f"registered fresh ({first})")
        again = (await http.post("/streams/v1/queries", json=body)).json()
        check(again["query_id"] == first["query_id"] and again["fresh"] is False, "the same hash finds the same query")
        r = await http.post("/streams/v1/queries", json={**body, "config_hash": "h2"})
        check(r.status_code == 409 and r.json()["success"] is False, f"another hash is refused ({r.status_code})")
        check("config_hash mismatch" in r.json()["error"], f"its error says config_hash mismatch ({r.json()['error']})")
        r = await http.post("/streams/v1/queries", json={**body, "config_hash": "h2", "reset": True})
        check(r.status_code == 200 and r.json()["reset"] is True and r.json()["query_id"] == first["query_id"], "reset stores the new hash")
        qid = first["query_id"]
        pid = str(uuid.uuid4())
        r = await http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []})
        check(r.status_code == 200 and r.json() == {"success": True, "rows": []}, "an empty shard reads no rows")
        r = await http.post("/streams/v1/state/get", json={"query_id": str(uuid.uuid4()), "partition_id": pid, "keys": []})
        check(r.status_code == 404, "an unknown query is a 404")
        cycle = {"query_id": qid, "partition_id": pid, "consumer_group": "g", "state_ops": [{"type": "upsert", "key": "k", "value": 1}]}
        r = await http.post("/streams/v1/cycle", json=cycle)
        check(r.status_code == 400 and r.json()["success"] is False, f"a partition of no source queue is refused ({r.text})")
        for bad in (
            {**cycle, "query_id": "nope"},
            {**cycle, "state_ops": [{"type": "merge", "key": "k"}]},
            {**cycle, "state_ops": [{"type": "upsert"}]},
            {**cycle, "ack": {"transactionId": "t", "status": "completed"}},
            {**cycle, "ack": "yes"},
        ):
            r = await http.post("/streams/v1/cycle", json=bad)
            check(r.status_code == 400 and "error" in r.json(), f"bad cycle refused: {r.json()['error']}")


async def racing_flushes(queen):
    """Two flush cycles that close one window, sent at once: the window reaches the sink once."""
    src, sink = f"st-rsrc-{uuid.uuid4().hex[:8]}", f"st-rsink-{uuid.uuid4().hex[:8]}"
    await queen.queue(src).config({"leaseTime": 30}).create()
    await queen.queue(sink).create()
    async with httpx.AsyncClient(base_url=URL) as http:
        reg = {"name": f"race-{src}", "source_queue": src, "sink_queue": sink, "config_hash": "h", "reset": False}
        qid = (await http.post("/streams/v1/queries", json=reg)).json()["query_id"]
        await queen.queue(src).partition("p").push([{"data": {"n": 0}, "transactionId": "r-0"}])
        msgs = await queen.queue(src).group("g").batch(1).wait(False).pop()
        check(len(msgs) == 1, "the source message popped")
        m = msgs[0]
        pid, lease = m["partitionId"], m["leaseId"]
        window = {"acc": 5, "windowStart": 0, "windowEnd": 1000}
        r = await http.post("/streams/v1/cycle", json={
            "query_id": qid, "partition_id": pid, "consumer_group": "g",
            "state_ops": [{"type": "upsert", "key": "w\u001f1", "value": window}],
            "ack": {"transactionId": m["transactionId"], "leaseId": lease, "status": "completed"}})
        check(r.status_code == 200 and r.json()["success"] is True, f"the cycle opened the window ({r.text})")

        def flush(n):
            return http.post("/streams/v1/cycle", json={
                "query_id": qid, "partition_id": pid, "consumer_group": "g",
                "state_ops": [{"type": "delete", "key": "w\u001f1"}],
                "push_items": [{"queue": sink, "partition": "out", "payload": {"acc": 5, "by": n}}],
                "ack": None})

        # Each flush's ripe read (the SDK's idle flush reads before it commits): both see the window.
        ripe = {"query_id": qid, "partition_id": pid, "keys": [], "key_prefix": "w\u001f", "ripe_at_or_before": 5000}
        reads = await asyncio.gather(*(http.post("/streams/v1/state/get", json=ripe) for _ in range(2)))
        check(all([row["key"] for row in r.json()["rows"]] == ["w\u001f1"] for r in reads), "both flushes read the ripe window")
        answers = await asyncio.gather(flush(1), flush(2))
        codes = sorted(a.status_code for a in answers)
        check(codes == [200, 409], f"one flush commits, the other is refused ({codes})")
        refused = next(a for a in answers if a.status_code == 409).json()
        check(refused["success"] is False and refused["code"] == "streams_state_changed", f"a clear reason ({refused['error']})")
        out = await drain(queen, sink, "check", 2, seconds=2)
        check(len(out) == 1, f"the window reached the sink once ({out})")
        r = await http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []})
        check(r.json()["rows"] == [], "its row is gone")

        # A flush while a worker holds the source lease: refused, nothing applied.
        await queen.queue(src).partition("p").push([{"data": {"n": 1}, "transactionId": "r-1"}])
        r = await http.post("/streams/v1/cycle", json={
            "query_id": qid, "partition_id": pid, "consumer_group": "g",
            "state_ops": [{"type": "upsert", "key": "w\u001f2", "value": window}], "ack": None})
        check(r.status_code == 200 and r.json()["success"] is True, "a flush with no lease live commits")
        held = await queen.queue(src).group("g").batch(1).wait(False).pop()
        check(len(held) == 1, "a worker holds the lease")
        r = await http.post("/streams/v1/cycle", json={
            "query_id": qid, "partition_id": pid, "consumer_group": "g",
            "state_ops": [{"type": "delete", "key": "w\u001f2"}],
            "push_items": [{"queue": sink, "partition": "out", "payload": {"acc": 5}}], "ack": None})
        check(r.status_code == 409 and r.json()["code"] == "streams_state_changed", f"a flush under a live lease is refused ({r.text})")
        r = await http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []})
        check([row["key"] for row in r.json()["rows"]] == ["w\u001f2"], "nothing of it applied")
        await queen.ack(held, True, {"group": "g"})


async def racing_sdk_workers(queen):
    """Two workers of one sliding-window query, idle flushes every 50 ms: each event is in two
    windows, so the sink's counts add up to exactly twice the events."""
    src, sink = f"st-wsrc-{uuid.uuid4().hex[:8]}", f"st-wsink-{uuid.uuid4().hex[:8]}"
    await queen.queue(src).create()
    await queen.queue(sink).create()
    query = f"slide-{src}"
    partitions, per_partition = 4, 6

    def sliding():
        return (
            Stream.from_(queen.queue(src))
            .window_sliding(size=1, slide=0.5, idle_flush_ms=50)
            .reduce(lambda acc, m: acc + 1, 0)
            .to(queen.queue(sink))
        )

    runners = [await sliding().run(query_id=query, url=URL, batch_size=1, max_wait_millis=200) for _ in range(2)]
    try:
        for i in range(per_partition):
            for p in range(partitions):
                await queen.queue(src).partition(f"p{p}").push([{"data": {"i": i}, "transactionId": f"s-{p}-{i}"}])
        got = []
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while sum(got) < 2 * partitions * per_partition and loop.time() < end:
            got.extend(o["value"] for o in await drain(queen, sink, "check", 1, seconds=1))
        await asyncio.sleep(1.5)
        got.extend(o["value"] for o in await drain(queen, sink, "check", 1, seconds=1))
    finally:
        for r in runners:
            await r.stop()
    flushes = sum(r.metrics()["flushCyclesTotal"] for r in runners)
    check(sum(got) == 2 * partitions * per_partition, f"every event counted once per window it is in ({sum(got)} of {2 * partitions * per_partition}, {flushes} flushes)")


async def hash_mismatch_through_the_sdk(queen):
    src = f"st-hsrc-{uuid.uuid4().hex[:8]}"
    await queen.queue(src).create()
    query = f"hash-{src}"
    runner = await Stream.from_(queen.queue(src)).map(lambda m: m).foreach(lambda v: None).run(query_id=query, url=URL)
    await runner.stop()
    try:
        changed = Stream.from_(queen.queue(src)).filter(lambda m: True).foreach(lambda v: None)
        await changed.run(query_id=query, url=URL)
        raise AssertionError("a changed pipeline registered without reset")
    except StreamsConfigHashMismatch as mismatch:
        check("config_hash mismatch" in str(mismatch), f"a changed pipeline is refused by its config_hash ({mismatch})")
    runner = await changed.run(query_id=query, url=URL, reset=True)
    await runner.stop()
    check(True, "reset=True registers the changed pipeline")


async def main():
    async with Queen(URL) as queen:
        await registration_and_routes()
        await tumbling_sum(queen)
        await gate(queen)
        await killed_worker(queen)
        await hash_mismatch_through_the_sdk(queen)
        await racing_flushes(queen)
        await racing_sdk_workers(queen)
    print("streams: all checks passed")


asyncio.run(main())
