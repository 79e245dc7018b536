"""The coordination surfaces of Queen's real Python client (queen-mq 2.6.0): every method of
`client.kv`, `client.locks`, `client.lock` / `client.semaphore` (context manager, automatic
renewal, `on_lost`), the transaction riders (`tx.once`, `guard`, `tx.kv`), and a consumer with
`.supervision()`, and every method of `client.timers` / `client.timer(q)` with the
timer rider, against a running broker.

Usage: python coordination.py http://127.0.0.1:PORT [json|compressed]
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import time
import uuid

import httpx
from queen import Queen
from queen.errors import KvError, LockError, LockNotHeldError

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


async def kv(queen, ns):
    kv = queen.kv
    put = await kv.put(ns, "cfg", {"a": 1}, forever=True)
    check(put and put["version"] > 0 and put["expiresAt"] is None, f"put forever ({dict(put)})")
    got = await kv.get(ns, "cfg")
    check(got and got["value"] == {"a": 1} and got["version"] == put["version"], "get returns the value and version")
    fenced = await kv.put(ns, "cfg", {"a": 2}, forever=True, expect=put["version"])
    check(fenced and fenced["version"] > put["version"], "a fenced put raises the version")
    stale = await kv.put(ns, "cfg", {"a": 3}, forever=True, expect=put["version"])
    check(not stale and stale["reason"] == "version" and stale["value"] == {"a": 2}, "a stale expect loses, with the current value")
    check(not await kv.put_if_absent(ns, "cfg", 0, ttl_seconds=60), "put_if_absent on a live key")
    check(await kv.once(ns, "job-1", ttl_seconds=60) is True, "once: the first caller wins")
    check(await kv.once(ns, "job-1", ttl_seconds=60) is False, "once: the second loses")
    many = await kv.get_many(ns, ["cfg", "nope"])
    check([r["key"] for r in many["rows"]] == ["cfg"] and many["missing"] == ["nope"], "get_many names rows and missing keys")
    for i in range(5):
        await kv.put(ns, f"p/{i}", i, ttl_seconds=60)
    page = await kv.get_prefix(ns, "p/", limit=2)
    check([r["key"] for r in page["rows"]] == ["p/0", "p/1"] and page["truncated"], "get_prefix pages")
    rows = await kv.list_all(ns, "p/", limit=2, keys_only=True)
    check([r["key"] for r in rows] == [f"p/{i}" for i in range(5)], "list_all follows nextAfter")
    admitted = [bool(await kv.incr(ns, "rate", max=3, ttl_seconds=60)) for _ in range(5)]
    check(admitted == [True, True, True, False, False], f"incr with max is a fixed-window limiter ({admitted})")
    limited = await kv.incr(ns, "rate", max=3, ttl_seconds=60)
    check(limited["reason"] == "limit" and limited["value"] == 3, "a refused incr spends nothing")
    check(await kv.check(ns, "cfg", expect=fenced["version"]), "check at the current version")
    check(not await kv.check(ns, "gone", expect=5), "check of an absent key")
    deleted = await kv.delete(ns, "cfg", expect=fenced["version"])
    check(deleted, "a fenced delete")
    again = await kv.delete(ns, "cfg")
    check(not again and again["reason"] == "absent", "delete is idempotent (absent, 200)")
    short = await kv.put(ns, "short", 1, ttl_seconds=1)
    await asyncio.sleep(1.3)
    check(not await kv.get(ns, "short"), "an expired key is absent")
    back = await kv.put_if_absent(ns, "short", 2, ttl_seconds=60)
    check(back and back["version"] > short["version"], "re-created after expiry with a higher version")
    batch = await kv.batch([kv.op.put(ns, "b1", 1, forever=True), kv.op.check(ns, "b2", expect=9, required=True)])
    check(batch[0]["applied"] is False and batch[1]["reason"] == "absent", "a failed required op rolls the batch back")
    check(not await kv.get(ns, "b1"), "nothing of the batch was stored")
    try:
        await kv.batch([{"op": "put", "ns": ns, "key": "k", "value": 1}])
        check(False, "a put without expiry is refused")
    except KvError as e:
        check(e.status == 400 and e.code == "kv_bad_request" and e.reason == "kv_expiry_not_specified",
              f"a put without expiry: 400 {e.code} {e.reason}")
    try:
        await kv.batch([{"op": "put", "ns": "queen-locks", "key": "x#0", "value": 1, "forever": True}])
        check(False, "the locks' namespace is not writable through /kv")
    except KvError as e:
        check(e.status == 400, "the locks' namespace is not writable through /kv")
    try:
        await kv.batch([kv.op.get(ns, "k")] * 257)
        check(False, "257 ops are refused")
    except KvError as e:
        check(e.status == 400, f"more ops than the limit: 400 {e.code}")
    async with httpx.AsyncClient(base_url=URL) as http:
        r = await http.put(f"/api/v1/kv/{ns}/curl/k?ttlSeconds=60", json={"x": 1})
        tag = r.headers.get("etag")
        check(r.status_code == 200 and tag, "PUT path form answers an ETag")
        r = await http.get(f"/api/v1/kv/{ns}/curl/k")
        check(r.status_code == 200 and r.json()["value"] == {"x": 1} and r.headers["etag"] == tag, "GET path form")
        r = await http.get(f"/api/v1/kv/{ns}/curl/k", headers={"If-None-Match": tag})
        check(r.status_code == 304, "If-None-Match of the current ETag: 304")
        r = await http.put(f"/api/v1/kv/{ns}/curl/k?ttlSeconds=60", json=2, headers={"If-Match": '"1"'})
        check(r.status_code == 412, "If-Match of another version: 412")
        r = await http.put(f"/api/v1/kv/{ns}/curl/k?ttlSeconds=60", json=2, headers={"If-None-Match": "*"})
        check(r.status_code == 412, "If-None-Match * on a live key: 412")
        r = await http.delete(f"/api/v1/kv/{ns}/curl/k", headers={"If-Match": tag})
        check(r.status_code == 200, "DELETE with If-Match")
        r = await http.get(f"/api/v1/kv/{ns}/curl/k")
        check(r.status_code == 404 and r.json()["found"] is False, "GET of an absent key: 404")
        r = await http.put(f"/api/v1/kv/{ns}/curl/k", json=1)
        check(r.status_code == 400 and r.json()["code"] == "kv_bad_request"
              and r.json()["reason"] == "kv_expiry_not_specified", "PUT without expiry: 400")


async def locks(queen, name):
    lk = queen.lock(name, ttl_seconds=3)
    check(await lk.acquire(), "lock.acquire")
    first = lk.token
    other = queen.lock(name, ttl_seconds=3)
    check(not await other.acquire(), "a second holder is refused")
    await asyncio.sleep(1.6)  # the handle renews every ttl/3
    check(lk.held and lk.token > first, "automatic renewal moves the token")
    held = await queen.locks.get(name)
    check(held["held"] and held["holders"][0]["owner"] == lk.owner, "locks.get names the holder")
    await queen.queue(f"{name}-q").create()
    res = await queen.transaction().guard(lk).queue(f"{name}-q").push([{"data": {"n": 1}}]).commit()
    check(res.get("success"), "a guarded transaction commits while the lock is held")
    check(await lk.release(), "lock.release")
    check(await other.acquire(), "the next holder acquires after a release")
    check(other.token > lk.token if lk.token else other.token > first, "tokens only rise across holders")
    await other.release()

    async with queen.lock(name, ttl_seconds=5) as held_lock:
        check(held_lock.held, "the context manager holds the lock")
        try:
            async with queen.lock(name, ttl_seconds=5):
                check(False, "a held lock's context manager raises")
        except LockNotHeldError:
            check(True, "a held lock's context manager raises LockNotHeldError")
    check((await queen.locks.get(name))["held"] is False, "the context manager released")

    lost = []
    zombie = queen.lock(name, ttl_seconds=1, auto_renew=False).on_lost(lost.append)
    check(await zombie.acquire(), "acquire without renewal")
    token = zombie.token
    await asyncio.sleep(1.3)
    check(lost == ["expired"] and zombie.lost.is_set(), f"on_lost after the lifetime ran out ({lost})")
    usurper = queen.lock(name, ttl_seconds=5)
    check(await usurper.acquire() and usurper.token > token, "a new holder after expiry, with a higher token")
    renewed = await queen.locks.renew(name, token=token, ttl_seconds=5)
    check(not renewed and renewed["reason"] == "lost", "the replaced holder's renew: lost")
    guard = {"op": "check", "ns": "queen-locks", "key": f"{name}#0", "expect": token, "required": True}
    res = await queen.transaction().queue(f"{name}-q").push([{"data": {"n": 2}}]).kv.check("queen-locks", f"{name}#0", expect=token, required=True).commit()
    check(res.get("success") is False and res.get("reason") == "kv_precondition", f"a stale guard rolls the transaction back ({res})")
    await usurper.release()
    del guard

    sem = [queen.semaphore(f"{name}-sem", 2, ttl_seconds=5) for _ in range(3)]
    got = [await s.acquire() for s in sem]
    check(got == [True, True, False] and {s.slot for s in sem[:2]} == {0, 1}, "a semaphore of 2 admits two")
    await sem[0].release()
    check(await sem[2].acquire(), "a released permit admits the third")
    for s in sem[1:]:
        await s.release()
    raw = await queen.locks.acquire(f"{name}-raw", ttl_seconds=5, owner="me")
    resent = await queen.locks.acquire(f"{name}-raw", ttl_seconds=5, owner="me")
    check(resent["acquired"] and resent.get("already") and resent["token"] == raw["token"], "a resent acquire answers the same permit")
    check(await queen.locks.release(f"{name}-raw", token=raw["token"]), "locks.release")
    try:
        await queen.locks.batch([{"op": "acquire", "name": "x"}])
        check(False, "an acquire without a lifetime is refused")
    except LockError as e:
        check(e.status == 400, "an acquire without a lifetime: 400")


async def riders(queen, ns):
    q = f"tx-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    res = await queen.transaction().once(ns, "step-1", ttl_seconds=60).queue(q).push([{"data": {"n": 1}}]).commit()
    check(res.get("success"), "tx.once commits the first time")
    res = await queen.transaction().once(ns, "step-1", ttl_seconds=60).queue(q).push([{"data": {"n": 2}}]).commit()
    check(res.get("success") is False and res.get("kvReason") == "exists", "tx.once refuses the second time")
    msgs = await queen.queue(q).batch(10).wait(False).pop()
    check([m["data"]["n"] for m in msgs] == [1], "only the first step's push was stored")
    res = await (queen.transaction().ack(msgs[0]).kv.put(ns, "state", {"done": 1}, forever=True).kv.incr(ns, "count", ttl_seconds=60).commit())
    check(res.get("success"), "an ack with KV writes commits")
    check((await queen.kv.get(ns, "state"))["value"] == {"done": 1}, "the rider's put is stored")
    check((await queen.kv.get(ns, "count"))["value"] == 1, "the rider's incr is stored")
    only_kv = await queen.transaction().kv.put(ns, "solo", 1, forever=True).commit()
    check(only_kv.get("success"), "a transaction of KV ops alone")


async def timers(queen):
    q = f"tm-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    t = queen.timers
    first = await t.schedule(q, "order:1:expire", {"order": 1}, delay_ms=60_000)
    check(first and first["status"] == "scheduled" and first["messageId"], f"schedule ({dict(first)})")
    again = await t.reschedule(q, "order:1:expire", {"order": 1, "v": 2}, delay_ms=60_000)
    check(again["status"] == "rescheduled" and again["messageId"] != first["messageId"], "reschedule is the same upsert, a new incarnation")
    peeked = await t.peek(q, "order:1:expire")
    check(peeked and peeked["txn"] == again["txn"], "peek")
    check(not await t.peek(q, "nope") and (await t.peek(q, "nope")) == {"found": False}, "peek of a miss: found false, 200")
    for i in range(3):
        await t.schedule(q, f"k/{i}", i, delay_ms=60_000)
    page = await t.list(q, limit=2)
    check(len(page["rows"]) == 2 and page["truncated"], "list pages")
    check(len(await t.list_all(q, limit=2)) == 4, "list_all walks the pages")
    gone = await t.cancel(q, "order:1:expire", txn=again["txn"])
    check(gone and gone["status"] == "cancelled", "cancel over DELETE")
    absent = await t.cancel(q, "order:1:expire", txn=again["txn"])
    check(not absent and absent["status"] == "absent" and absent["txn"] == again["txn"], "a second cancel: absent, txn echoed")
    try:
        await t.batch([{"op": "schedule", "queue": q, "timerKey": "far", "payload": "MQ==", "delayMs": 91 * 86_400_000, "txn": "x"}])
        check(False, "a delay past the horizon is refused")
    except Exception as e:
        check(getattr(e, "status", None) == 400, "a delay past the horizon: 400")

    # A consumer parked on the queue gets the message once it is due, never before.
    parked = asyncio.ensure_future(queen.queue(q).partition("due").batch(5).wait(True).timeout_millis(10_000).pop())
    await asyncio.sleep(0.2)
    built = await queen.timer(q).key("due-1").payload({"due": True}).after_ms(700).schedule()
    check(built and built["status"] == "scheduled", "the timer builder schedules")
    # The builder names no partition; the parked consumer waits on one, so schedule through it.
    due = await t.schedule(q, "due-2", {"due": 2}, delay_ms=700, partition="due")
    sent = time.time()
    msgs = await parked
    got = time.time()
    check([m["data"] for m in msgs] == [{"due": 2}], f"the parked consumer gets the timer's message ({msgs})")
    check(got - sent >= 0.65, f"not before deliverAt ({got - sent:.3f} s after a 700 ms delay)")
    check(msgs[0]["transactionId"] == due["txn"], "the message carries the schedule's txn")
    check(msgs[0]["id"] == due["messageId"], "the message has the id the schedule promised")
    res = await queen.transaction().timer(q).key("rider").payload({"r": 1}).after_ms(0).schedule().commit()
    check(res.get("success") and res["results"][0]["status"] == "scheduled", "a timer rider commits")
    rest = await queen.queue(q).batch(10).wait(True).timeout_millis(5000).pop()
    check(any(m["data"] == {"r": 1} for m in rest) or any(m["data"] == {"due": True} for m in rest), "the rider's timer fires")


async def supervised(queen):
    q = f"sup-{uuid.uuid4().hex[:8]}"
    await queen.queue(q).create()
    await queen.queue(q).push([{"data": {"i": i}} for i in range(3)])
    seen = []

    async def handler(msg):
        seen.append(msg["data"]["i"])

    await queen.queue(q).group("g").batch(1).wait(False).limit(3).each().supervision({"group": "coord-test"}).consume(handler)
    check(sorted(seen) == [0, 1, 2], "a supervised consumer consumes")
    rows = await queen.kv.list_all("queen-supervisor", "coord-test/")
    heads = [r for r in rows if r["key"].endswith("/head")]
    check(heads and heads[0]["value"]["format"] == "queen.supervisor.remote-status/v1", "supervision publishes its status into KV")


async def main():
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    async with Queen(URL, **WIRE) as queen:
        await kv(queen, ns)
        await locks(queen, f"lock-{uuid.uuid4().hex[:8]}")
        await riders(queen, ns)
        await timers(queen)
        await supervised(queen)
    print("coordination: all checks passed")


asyncio.run(main())
