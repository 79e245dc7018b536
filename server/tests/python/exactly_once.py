"""Exactly once where users count, on real processes: two brokers on one PostgreSQL, one of them
killed with SIGKILL and started again, and PostgreSQL restarted, while this script runs
(server/tests/faults.rs does the killing and restarting). Three workloads, each call through
either broker:
- a rate limiter: `incr` by one with `max`, never resent (a call without an answer, or answered
  5xx, has an unknown outcome);
- a lock (`limit` 1, 2 s permits) whose holders renew now and then and write with each token
  they were granted to a fenced resource here, which refuses a token below the highest it
  accepted;
- a windowed stream through Queen's streams SDK: a tumbling-window count per partition, its
  worker on broker A (the one killed), the producers on broker B.

The stream is checked here (each partition's one window counts every event once). The counter
and the fenced writes are printed as one `HISTORY <json>` line for the Rust test to hold to the
simulation's own checkers.

Usage: python exactly_once.py URL_A URL_B SECONDS
"""
import asyncio
import json
import random
import sys
import uuid

import httpx
from queen import Queen, Stream

URL_A, URL_B, SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
URLS = [URL_A, URL_B]
RUN = uuid.uuid4().hex[:8]
NS, KEY, MAX = "eo", f"ctr-{RUN}", 400
LOCK = f"eo-lock-{RUN}"
PARTITIONS = 3
BASE_MS = 1_700_000_000_000


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}", flush=True)


class FencedResource:
    """Accepts a write only with a token at or above the highest it accepted."""

    def __init__(self):
        self.highest = None
        self.writes = []

    def write(self, tenure, token):
        accepted = self.highest is None or token >= self.highest
        if accepted:
            self.highest = token
        self.writes.append({"tenure": tenure, "token": token, "accepted": accepted})


async def counter(i, stop, outcomes):
    async with httpx.AsyncClient(timeout=3.0) as http:
        n = 0
        while not stop.is_set():
            n += 1
            url = URLS[(i + n) % 2]
            body = {"operations": [{"op": "incr", "ns": NS, "key": KEY, "delta": 1, "max": MAX, "forever": True}]}
            try:
                r = await http.post(url + "/api/v1/kv", json=body)
            except httpx.HTTPError as e:
                outcomes.append({"unknown": type(e).__name__})
                await asyncio.sleep(0.05)
                continue
            if r.status_code == 200:
                res = r.json()["results"][0]
                outcomes.append({"admitted": res["value"]} if res.get("applied") is True else {"refused": True})
            elif r.status_code >= 500:
                outcomes.append({"unknown": r.status_code})
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"an incr answered {r.status_code}: {r.text}")
            await asyncio.sleep(random.uniform(0.01, 0.04))


async def locks(call, body):
    """One lock op: its result, or None (no answer, or a 5xx)."""
    try:
        r = await call(body)
    except httpx.HTTPError:
        return None
    if r.status_code >= 500:
        return None
    if r.status_code != 200:
        raise AssertionError(f"a lock op answered {r.status_code}: {r.text}")
    return r.json()["results"][0]


async def holder(i, stop, resource, counts):
    owner = f"w{i}"
    tenure = 0
    async with httpx.AsyncClient(timeout=3.0) as http:
        n = 0
        while not stop.is_set():
            n += 1
            url = URLS[(i + n) % 2]

            def call(body, url=url):
                return http.post(url + "/api/v1/locks", json=body)

            got = await locks(call, {"operations": [{"op": "acquire", "name": LOCK, "ttlSeconds": 2, "owner": owner}]})
            if not got or got.get("acquired") is not True:
                await asyncio.sleep(0.02)
                continue
            if got.get("already") is not True:
                tenure += 1
            who = f"{owner}-{tenure}"
            token, slot = got["token"], got["slot"]
            counts["acquired"] += 1
            resource.write(who, token)
            await asyncio.sleep(random.uniform(0.01, 0.15))
            if random.random() < 0.4:
                renewed = await locks(call, {"operations": [{"op": "renew", "name": LOCK, "token": token,
                                                             "slot": slot, "ttlSeconds": 2, "owner": owner}]})
                if renewed and renewed.get("renewed") is True:
                    counts["renewed"] += 1
                    token = renewed["token"]
                    resource.write(who, token)
            await asyncio.sleep(random.uniform(0.01, 0.1))
            resource.write(who, token)
            if await locks(call, {"operations": [{"op": "release", "name": LOCK, "token": token, "slot": slot}]}):
                counts["released"] += 1


async def push_until_stored(queen, queue, partition, items):
    """Pushes with the same transactionIds until one answer says stored (a retried push whose
    first answer was lost is deduplicated)."""
    while True:
        try:
            await queen.queue(queue).partition(partition).push(items)
            return
        except Exception:  # noqa: BLE001 - the faults' refusals, retried
            await asyncio.sleep(0.2)


async def produce(qb, src, stop, sent):
    n = 0
    while not stop.is_set():
        p = n % PARTITIONS
        items = [{"data": {"ts": BASE_MS + 10 + n, "v": 1}, "transactionId": f"e-{n}-{i}"} for i in range(5)]
        await push_until_stored(qb, src, f"p{p}", items)
        sent[p] += len(items)
        n += 1
        await asyncio.sleep(0.05)


async def main():
    async with Queen(URL_A) as qa, Queen(URL_B) as qb:
        src, sink = f"eo-src-{RUN}", f"eo-sink-{RUN}"
        await qb.queue(src).config({"leaseTime": 3}).create()
        await qb.queue(sink).create()
        stream = (
            Stream.from_(qa.queue(src))
            .window_tumbling(seconds=3600, event_time=lambda m: (m.get("data") or m)["ts"], idle_flush_ms=600_000)
            .reduce(lambda acc, m: acc + m["v"], 0)
            .to(qa.queue(sink))
        )
        runner = await stream.run(query_id=f"eo-{RUN}", url=URL_A, batch_size=5, max_wait_millis=300)
        stop = asyncio.Event()
        outcomes, resource = [], FencedResource()
        counts = {"acquired": 0, "renewed": 0, "released": 0}
        sent = [0] * PARTITIONS
        tasks = [asyncio.create_task(counter(i, stop, outcomes)) for i in range(3)]
        tasks += [asyncio.create_task(holder(i, stop, resource, counts)) for i in range(3)]
        tasks.append(asyncio.create_task(produce(qb, src, stop, sent)))
        print("ready", flush=True)
        try:
            await asyncio.sleep(SECONDS)
            stop.set()
            await asyncio.gather(*tasks)
            # Close each partition's window: an event an hour later.
            for p in range(PARTITIONS):
                closer = [{"data": {"ts": BASE_MS + 3_600_000 + 10, "v": 0}, "transactionId": f"closer-{p}"}]
                await push_until_stored(qb, src, f"p{p}", closer)
            out = []
            loop = asyncio.get_running_loop()
            end = loop.time() + 90
            while len(out) < PARTITIONS and loop.time() < end:
                try:
                    msgs = await qb.queue(sink).group("check").batch(100).wait(True).timeout_millis(1000).pop()
                except Exception:  # noqa: BLE001 - a pop the faults' tail refused, again
                    await asyncio.sleep(0.2)
                    continue
                if msgs:
                    out.extend(m for m in msgs)
                    await qb.ack(msgs, True, {"group": "check"})
            await asyncio.sleep(1.0)
            late = await qb.queue(sink).group("check").batch(100).wait(False).pop()
            out.extend(late or [])
        finally:
            await runner.stop()
        windows = sorted((m["partition"], m["data"]["value"]) for m in out)
        want = sorted((f"p{p}", sent[p]) for p in range(PARTITIONS))
        check(windows == want, f"each partition's window once, every event counted once ({windows}, sent {want})")
        metrics = runner.metrics()
        print(f"stream: cycles {metrics['cyclesTotal']}, failed pops or cycles {metrics['errorsTotal']}", flush=True)
        print(f"locks: {counts}", flush=True)
        print("HISTORY " + json.dumps({"counter": {"ns": NS, "key": KEY, "max": MAX, "outcomes": outcomes},
                                       "fenced": resource.writes}), flush=True)
    print("exactly once: all checks passed", flush=True)


asyncio.run(main())
