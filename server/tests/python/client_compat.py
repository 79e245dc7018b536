"""Drives a running broker through Queen's real Python client (queen-mq 2.6.0), unchanged.

Usage: python client_compat.py http://127.0.0.1:PORT [json|binary|compressed]
With QUEEN_BEARER_TOKEN set (a broker with JWT auth on), every request carries it: the client's
through `bearer_token`, the script's own raw httpx calls as an Authorization header.
The mode picks the client's wire: JSON (the default); binary pushes (QPB1) and framed pop answers
(QPF1); or those with client-compressed frames and binary transactions (QTB1). Every check is the
same in every mode. Exits non-zero with a message on the first failed expectation.
"""
import asyncio
import os
import sys
import uuid

import httpx
from queen import Queen

URL = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "json"
CLIENT_OPTIONS = {
    "json": {},
    "binary": {"binary_push": True, "framed_pop": True},
    "compressed": {"binary_push": True, "push_compression": True, "framed_pop": True},
}[MODE]
TOKEN = os.environ.get("QUEEN_BEARER_TOKEN")
if TOKEN:
    CLIENT_OPTIONS["bearer_token"] = TOKEN
HEADERS = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}


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


async def autopilot_sizes_the_pop(queen):
    # The client's default pop leaves batch and partitions to the broker (autopilot=true) and
    # reads back what the broker chose.
    q = unique("compat-autopilot")
    await queen.queue(q).create()
    for i in range(30):
        await queen.queue(q).partition(f"p{i:02}").push([{"data": {"i": i}}])
    seen, widths = [], []
    while True:
        res = await queen.queue(q).group("ap").wait(False).pop_result()
        if not res.messages:
            break
        check(res.autopilot is not None, "pop_result() reads the broker's autopilot choice")
        check(res.autopilot.partitions >= len({m["partition"] for m in res.messages}), "the claim is within the echoed width")
        check(res.autopilot.batch >= len(res.messages) and res.autopilot.wait_millis == 0, "and within the echoed budget")
        widths.append(res.autopilot.partitions)
        seen += [m["data"]["i"] for m in res.messages]
        await queen.ack(res.messages, True, {"group": "ap"})
    check(sorted(seen) == list(range(30)), f"every message once ({len(seen)})")
    check(max(widths) > 1 and len(widths) < 15, f"the broker swept several partitions a pop ({widths})")

    # consume() with the defaults: the handler gets the broker-sized batches as lists.
    q = unique("compat-autopilot-consume")
    await queen.queue(q).create()
    for j in range(20):
        await queen.queue(q).partition(f"c{j:02}").push([{"data": {"j": j}}])
    got = []

    async def handler(messages):
        got.extend(m["data"]["j"] for m in messages)

    await queen.queue(q).group("consumer").wait(False).limit(20).consume(handler)
    check(sorted(got) == list(range(20)), f"a default consume() drains broker-sized batches ({len(got)})")

    # A pinned knob is kept; autopilot(False) sends no flag and gets no echo.
    pinned = await queen.queue(q).group("pinned").partitions(1).wait(False).pop_result()
    check(pinned.autopilot is not None and pinned.autopilot.partitions == 1, "partitions(1) stays one partition wide")
    check(pinned.autopilot.batch == 200, f"and the broker sizes its batch ({pinned.autopilot})")
    off = await queen.queue(q).group("off").autopilot(False).wait(False).pop_result()
    check(len(off.messages) == 1 and off.autopilot is None, "autopilot(False): batch 1, no echo")


async def commit_on_delivery(queen):
    q = unique("compat-autoack")
    await queen.queue(q).create()
    await queen.queue(q).push([{"data": {"x": 1}}])
    msgs = await queen.queue(q).group("g").batch(10).wait(False).commit_on_delivery().pop()
    check(len(msgs) == 1 and msgs[0]["leaseId"] == "", "commit_on_delivery: delivered with an empty leaseId")
    again = await queen.queue(q).group("g").batch(10).wait(False).pop()
    check(again == [], "commit_on_delivery committed at delivery")


async def nack_retry_dlq(queen):
    # retryLimit 1: two deliveries, then one dead letter (the testDLQ scenario).
    q = unique("compat-dlq")
    await queen.queue(q).config({"retryLimit": 1, "dlqAfterMaxRetries": True}).create()
    await queen.queue(q).push([{"data": {"message": "poison"}}])
    deliveries = 0
    for _ in range(2):
        # The redelivery comes after retryDelay (1000 ms by default): a waiting pop gets it.
        msgs = await queen.queue(q).batch(1).wait(True).timeout_millis(10000).pop()
        if not msgs:
            break
        deliveries += 1
        res = await queen.ack(msgs[0], False, {"error": "Test error: always fails"})
        check(res.get("success") is True, "a failed ack is accepted")
    check(deliveries == 2, f"retryLimit 1 gives two deliveries ({deliveries})")
    await asyncio.sleep(1.2)
    left = await queen.queue(q).batch(1).wait(False).pop()
    check(left == [], "dead-lettered, not delivered a third time")
    dlq = await queen.queue(q).dlq().limit(10).get()
    check(dlq.get("total") == 1 and len(dlq["messages"]) == 1, f"one dead letter, with a total ({dlq.get('total')})")
    m = dlq["messages"][0]
    check(m["data"] == {"message": "poison"} and "Test error" in (m.get("errorMessage") or ""), "the dead letter carries the message and the error")
    dlq_rows = (await httpx.AsyncClient(base_url=URL, headers=HEADERS).get("/api/v1/dlq", params={"queue": q})).json()["messages"]
    check(len(dlq_rows) == 1, "the raw DLQ listing agrees")


async def transaction_pop_process_push_ack(queen):
    src, dst = unique("compat-tx-in"), unique("compat-tx-out")
    await queen.queue(src).create()
    await queen.queue(dst).create()
    await queen.queue(src).push([{"data": {"value": 1}}])
    msgs = await queen.queue(src).batch(1).wait(False).pop()
    check(len(msgs) == 1, "popped the input")
    result = await (queen.transaction().ack(msgs[0]).queue(dst).push([{"data": {"value": msgs[0]["data"]["value"] + 1}}]).commit())
    check(bool(result), "the transaction commits")
    out = await queen.queue(dst).batch(10).wait(False).pop()
    check(len(out) == 1 and out[0]["data"] == {"value": 2}, "the pushed result is there")
    left = await queen.queue(src).batch(10).wait(False).pop()
    check(left == [], "the input was acked by the transaction")
    failed = False
    try:
        await (queen.transaction().queue(dst).push([{"data": {"never": True}}])
               .ack({"transactionId": "no-such", "partitionId": out[0]["partitionId"], "leaseId": out[0]["leaseId"]}).commit())
    except Exception:
        failed = True
    check(failed, "a transaction with a refused ack raises")
    await queen.ack(out, True)
    rest = await queen.queue(dst).batch(10).wait(False).pop()
    check(rest == [], "the refused transaction's push was rolled back")


async def seek_and_replay(queen):
    q = unique("compat-seek")
    await queen.queue(q).create()
    before = (await httpx.AsyncClient(base_url=URL, headers=HEADERS).get("/health")).headers.get("date")
    await asyncio.sleep(1.1)
    await queen.queue(q).push([{"data": {"i": i}} for i in range(3)])
    first = await queen.queue(q).group("replayer").batch(10).wait(False).pop()
    check(len(first) == 3, "the group consumed the messages")
    await queen.ack(first, True, {"group": "replayer"})
    from email.utils import parsedate_to_datetime
    ts = parsedate_to_datetime(before).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    res = await queen.admin.seek_consumer_group("replayer", q, {"timestamp": ts})
    check(res.get("success") is True and res.get("partitionsUpdated") == 1, f"seek answers ({res})")
    again = await queen.queue(q).group("replayer").batch(10).wait(False).pop()
    check([m["data"]["i"] for m in again] == [0, 1, 2], "a seek back replays the messages in order")
    await queen.ack(again, True, {"group": "replayer"})
    deleted = await queen.delete_consumer_group("replayer", True)
    check(deleted.get("success") is True, "delete the consumer group")
    fresh = await queen.queue(q).group("replayer").batch(10).wait(False).pop()
    check(len(fresh) == 3, "a deleted group re-consumes from the start")


async def js_pop_shape():
    # js 0.15: client.queue(q).batch(1).wait(true).pop() sends batch, wait, timeout first.
    q = unique("compat-js")
    async with httpx.AsyncClient(base_url=URL, timeout=20, headers=HEADERS) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": {"js": 1}}]})
        check(r.status_code == 201, "raw JSON push answers 201")
        r = await http.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "wait": "true", "timeout": 5000}, headers={"Content-Type": "application/json"})
        check(r.status_code == 200, "js-shaped pop answers 200")
        body = r.json()
        m = body["messages"][0]
        check(body["success"] is True and m["data"] == {"js": 1} and m["partitionId"] and m["leaseId"], "js-shaped answer")
        r = await http.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "wait": "false"})
        check(r.status_code == 204 and r.content == b"", "an empty pop is 204 with no body")


async def large_batches(queen):
    # One push of 300 messages is one segment: a pop of 10 slices it, a pop of the other 290
    # takes most of it (a framed answer then ships the stored segment as it is).
    q = unique("compat-large")
    await queen.queue(q).create()
    pushed = await queen.queue(q).push([{"data": {"i": i, "text": "x" * (i % 7)}} for i in range(300)])
    check(len(pushed) == 300 and all(p["status"] == "queued" for p in pushed), "300 messages queued in one push")
    head = await queen.queue(q).batch(10).wait(False).pop()
    check([m["data"]["i"] for m in head] == list(range(10)), "a pop of 10 takes the first 10, in order")
    await queen.ack(head, True)
    rest = await queen.queue(q).batch(1000).wait(False).pop()
    check([m["data"]["i"] for m in rest] == list(range(10, 300)), "the next pop takes the other 290, in order")
    check(all(m["data"]["text"] == "x" * (m["data"]["i"] % 7) for m in rest), "every payload intact")
    res = await queen.ack(rest, True)
    check(res.get("success") is True, "the batch ack of 290 succeeds")
    left = await queen.queue(q).batch(10).wait(False).pop()
    check(left == [], "nothing is left after the acks")


async def wire_was_used():
    # The client falls back to JSON silently where it must: the broker's counters say whether the
    # binary forms were really spoken.
    async with httpx.AsyncClient(base_url=URL, timeout=20, headers=HEADERS) as http:
        binary = (await http.get("/metrics")).json()["binary"]
    if MODE == "json":
        check(binary == {"pushes": 0, "transactions": 0, "framedPops": 0}, f"JSON mode spoke JSON only ({binary})")
        return
    check(binary["pushes"] > 0, f"pushes travelled as QPB1 ({binary})")
    check(binary["framedPops"] > 0, f"pops were answered as QPF1 ({binary})")
    if MODE == "compressed":
        check(binary["transactions"] > 0, f"transactions travelled as QTB1 ({binary})")


async def main():
    print(f"mode: {MODE} {CLIENT_OPTIONS}")
    async with Queen(URL, **CLIENT_OPTIONS) as queen:
        await large_batches(queen)
        await configure_push_duplicate(queen)
        await pop_with_wait(queen)
        await renew_and_batch_ack(queen)
        await consume_single_ack(queen)
        await groups_and_subscription_modes(queen)
        await commit_on_delivery(queen)
        await autopilot_sizes_the_pop(queen)
        await nack_retry_dlq(queen)
        await transaction_pop_process_push_ack(queen)
        await seek_and_replay(queen)
    await js_pop_shape()
    await wire_was_used()
    print("client compatibility: all checks passed")


asyncio.run(main())
