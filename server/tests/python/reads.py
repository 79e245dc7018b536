"""Reads by offset and partition discovery through Queen's real Python client (queen-mq 2.6.0):
`queue(q).fetch(...)` (offsets, byte budgets smaller than a record, unknown partitions, the
restart at `logStartOffset` after retention) and `queue(q).changed_since(...)` (paging past
one page, `safeTime` as the next `since`), against a running broker whose retention worker runs
every 200 ms.

Usage: python reads.py http://127.0.0.1:PORT [json|compressed]
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import uuid

from queen import Queen

URL = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "json"
WIRE = {
    "json": {},
    "compressed": {"binary_push": True, "push_compression": True, "framed_pop": True},
}[MODE]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


async def fetch(queen):
    q = f"reads-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    for chunk in range(3):
        items = [{"data": {"n": chunk * 7 + i, "pad": "x" * 40}, "transactionId": f"p0-{chunk}-{i}"} for i in range(7)]
        await queen.queue(q).partition("p0").push(items)
    await queen.queue(q).partition("p1").push([{"data": {"n": i}} for i in range(10)])
    read = await queen.queue(q).fetch(["p0", "p1", "never-written"])
    p0 = read["p0"]
    check([r["offset"] for r in p0["records"]] == list(range(21)), "p0 read in offset order across three pushes")
    check([r["payload"]["n"] for r in p0["records"]] == list(range(21)), "payloads as pushed")
    check(p0["records"][8]["transactionId"] == "p0-1-1", "each record's transactionId")
    check(p0["highWatermark"] == 21 and p0["logStartOffset"] == 0 and p0["nextOffset"] == 21, f"p0's range ({p0['highWatermark']}, {p0['logStartOffset']})")
    check(all(isinstance(r["ts"], str) and r["ts"].endswith("Z") for r in p0["records"]), "each record's time")
    check(len(read["p1"]["records"]) == 10, "p1 read whole")
    check(read["never-written"]["records"] == [], "a partition nobody wrote reads nothing")
    later = await queen.queue(q).fetch("p0", offsets={"p0": 15})
    check([r["offset"] for r in later["p0"]["records"]] == list(range(15, 21)), "from an offset inside a push")
    small = await queen.queue(q).fetch("p0", max_bytes=10)
    check([r["offset"] for r in small["p0"]["records"]] == list(range(21)), "a budget smaller than one record still reads everything")
    await queen.queue(q).partition("p0").push([{"data": {"n": 21}}])
    more = await queen.queue(q).fetch("p0", offsets={"p0": p0["nextOffset"]})
    check([r["offset"] for r in more["p0"]["records"]] == [21], "from nextOffset: only what is new")
    missing = await queen.queue(f"{q}-absent").fetch("p0")
    check(missing["p0"]["records"] == [], "a queue that does not exist reads nothing")


async def fetch_after_retention(queen):
    q = f"reads-ret-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).config({"retentionEnabled": True, "completedRetentionSeconds": 1}).create()
    await queen.queue(q).partition("p").push([{"data": {"n": i}} for i in range(10)])
    msgs = await queen.queue(q).partition("p").group("g").batch(10).wait(False).pop()
    check(len(msgs) == 10, "the group took the first ten")
    await queen.ack(msgs, True, {"group": "g"})
    start = 0
    for _ in range(100):
        read = await queen.queue(q).fetch("p")
        start = read["p"]["logStartOffset"]
        if start == 10:
            break
        await asyncio.sleep(0.2)
    check(start == 10, f"retention removed what the group completed (logStartOffset {start})")
    await queen.queue(q).partition("p").push([{"data": {"n": i}} for i in range(10, 15)])
    read = await queen.queue(q).fetch("p")
    check([r["offset"] for r in read["p"]["records"]] == list(range(10, 15)), "a read from 0 restarts at logStartOffset")
    check(read["p"]["logStartOffset"] == 10 and read["p"]["highWatermark"] == 15, "the retained range after retention")


async def changed(queen):
    q = f"reads-ch-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    names = [f"part-{i:04d}" for i in range(1100)]
    # One push per partition, in batches of calls, so more than one page exists.
    for i in range(0, len(names), 100):
        await asyncio.gather(*[queen.queue(q).partition(n).push([{"data": {"n": 1}}]) for n in names[i : i + 100]])
    every = await queen.queue(q).changed_since(None)
    listed = [p["name"] for p in every["partitions"]]
    check(set(names) <= set(listed) and len(listed) == len(set(listed)), f"every partition once across pages ({len(listed)})")
    first = next(p for p in every["partitions"] if p["name"] == "part-0000")
    check(first["lastOffset"] == 0 and first["logStart"] == 0 and first["lastWriteAt"].endswith("Z"), f"a partition's fields ({first})")
    check(isinstance(every["safeTime"], str), "a safeTime")
    # Past the second of the writes, a safeTime closes them: only later writes are listed.
    await asyncio.sleep(1.1)
    mark = (await queen.queue(q).changed_since(None))["safeTime"]
    await queen.queue(q).partition("part-0007").push([{"data": {"n": 2}}])
    since = await queen.queue(q).changed_since(mark)
    check([p["name"] for p in since["partitions"]] == ["part-0007"], f"written since the safeTime ({[p['name'] for p in since['partitions']]})")
    check(since["partitions"][0]["lastWriteAt"] > mark, "a later write's time is above the safeTime")
    none = await queen.queue(f"{q}-absent").changed_since(None)
    check(none["partitions"] == [], "a queue that does not exist has none")


async def main():
    async with Queen(URL, **WIRE) as queen:
        await fetch(queen)
        await fetch_after_retention(queen)
        await changed(queen)
    print("reads: all checks passed")


asyncio.run(main())
