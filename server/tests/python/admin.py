"""Every admin call of Queen's real Python client (queen-mq 2.6.0, queen/admin/admin.py) against
a running broker, and traces written by the client's own consume loop (`message["trace"]`).

Usage: python admin.py http://127.0.0.1:PORT [json|binary|compressed]
Exits non-zero on the first failed expectation.
"""
import asyncio
import sys
import uuid

import httpx
from queen import Queen

URL = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "json"
WIRE = {
    "json": {},
    "binary": {"binary_push": True, "framed_pop": True},
    "compressed": {"binary_push": True, "push_compression": True, "framed_pop": True},
}[MODE]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


async def main():
    q = f"adm-{uuid.uuid4().hex[:8]}"
    trace_name = f"order-{uuid.uuid4().hex[:6]}"
    async with Queen(URL, **WIRE) as queen:
        admin = queen.admin
        await queen.queue(q).config({"retryLimit": 0}).create()
        await queen.queue(q).partition("p1").push([{"data": {"i": i}, "transactionId": f"t{i}"} for i in range(3)])
        await queen.queue(q).partition("p2").push([{"data": {"i": 9}, "transactionId": "t9"}])

        traced = []

        async def handler(msg):
            r = await msg["trace"]({"traceName": trace_name, "data": {"text": f"handled {msg['data']['i']}"}})
            traced.append((msg["transactionId"], r))

        await queen.queue(q).group("workers").batch(1).wait(False).limit(2).each().consume(handler)
        check(len(traced) == 2 and all(r.get("success") for _, r in traced), f"the consume loop's traces are stored ({traced})")

        overview = await admin.get_overview()
        check(overview["queues"] >= 1 and overview["messages"]["total"] >= 4, "get_overview counts the queue")
        check("namespaces" in await admin.get_namespaces(), "get_namespaces")
        check("tasks" in await admin.get_tasks(), "get_tasks")
        queues = await admin.list_queues(limit=500)
        mine = [x for x in queues["queues"] if x["name"] == q]
        check(len(mine) == 1 and mine[0]["partitions"] == 3, "list_queues shows the queue and its partitions")
        detail = await admin.get_queue(q)
        check([p["name"] for p in detail["partitions"]] == ["Default", "p1", "p2"], "get_queue lists partitions by name")
        depth = await admin.get_queue_depth(q, "workers")
        check(depth["pending"] == 2 and depth["partitionsPending"] in (1, 2), f"get_queue_depth for the group ({depth})")
        parts = await admin.get_partitions(queue=q, minDepth=1)
        check(parts["total"] == depth["partitionsPending"], "get_partitions filters by depth (the slowest named group's)")

        listed = await admin.list_messages(queue=q, limit=2)
        check(len(listed["messages"]) == 2 and listed["messages"][0]["transactionId"] == "t9", "list_messages pages newest first")
        rest = await admin.list_messages(queue=q, limit=2, offset=2)
        check(len(rest["messages"]) == 2, "list_messages' offset reaches the rest")
        tx = traced[0][0]
        m = next(x for x in listed["messages"] + rest["messages"] if x["transactionId"] == tx)
        pid = m["partitionId"]
        one = await admin.get_message(pid, tx)
        check(one["payload"] == m["data"] and one["status"] == "completed", f"get_message answers the payload ({one['status']})")

        traces = await admin.get_traces_for_message(pid, tx)
        check([t["data"]["text"] for t in traces["traces"]] == [f"handled {m['data']['i']}"], "get_traces_for_message")
        named = await admin.get_traces_by_name(trace_name, limit=1)
        check(named["total"] == 2 and len(named["traces"]) == 1, "get_traces_by_name pages")
        names = await admin.get_trace_names()
        check(any(n["trace_name"] == trace_name for n in names["trace_names"]), "get_trace_names")

        groups = await admin.list_consumer_groups()
        workers = [g for g in groups if g["name"] == "workers" and g["queueName"] == q]
        check(len(workers) == 1 and workers[0]["totalLag"] == 2, f"list_consumer_groups shows the group's lag ({workers})")
        group = await admin.get_consumer_group("workers")
        check(q in group, "get_consumer_group is keyed by queue")
        check(isinstance(await admin.get_lagging_consumers(60), list), "get_lagging_consumers")
        await admin.refresh_consumer_stats()

        # A dead letter, retried through the admin API, then one deleted.
        await queen.queue(q).partition("p2").push([{"data": {"i": 10}, "transactionId": "t10"}])
        msgs = await queen.queue(q).partition("p2").batch(1).wait(False).pop()
        check([x["transactionId"] for x in msgs] == ["t9"], "queue mode pops p2 from its start")
        await queen.ack(msgs, False, {"error": "boom"})
        dead = await admin.list_messages(queue=q, status="dead_letter")
        check([x["transactionId"] for x in dead["messages"]] == ["t9"], "a failed message shows as dead_letter")
        p2 = dead["messages"][0]["partitionId"]
        retried = await admin.retry_message(p2, "t9")
        check(retried["success"] and retried["dlqRowRemoved"], "retry_message replays the dead letter")
        again = await queen.queue(q).partition("p2").batch(5).wait(False).pop()
        check([x["data"] for x in again] == [{"i": 10}, {"i": 9}], "the replayed message is delivered again, after t10")
        await queen.ack(again, False, {"error": "boom again"})
        re_dead = await admin.list_messages(queue=q, status="dead_letter")
        t = re_dead["messages"][0]["transactionId"]
        deleted = await admin.delete_message(p2, t)
        check(deleted["success"], "delete_message removes a dead letter")

        status = await admin.get_status()
        check("throughput" in status and "messages" in status, "get_status")
        stats = await admin.get_queue_stats(limit=500)
        check(any(x["name"] == q for x in stats["queues"]), "get_queue_stats")
        qd = await admin.get_queue_detail(q)
        check(qd["queue"]["config"]["retryLimit"] == 0, "get_queue_detail shows the config")
        check("dataPoints" in await admin.get_analytics(interval="minute"), "get_analytics")
        check("replicas" in await admin.get_system_metrics(), "get_system_metrics")
        check("timeSeries" in await admin.get_worker_metrics(), "get_worker_metrics")
        check((await admin.health())["status"] in ("healthy", "ok"), "health")
        check(await admin.metrics() is not None, "metrics")

        # An unknown queue is a real 404.
        try:
            await admin.get_queue(f"{q}-absent")
            check(False, "get_queue of an unknown queue fails")
        except httpx.HTTPStatusError as e:
            check(e.response.status_code == 404, "get_queue of an unknown queue is a 404")
    print("admin: all checks passed")


asyncio.run(main())
