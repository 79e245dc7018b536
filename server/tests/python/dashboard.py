"""The dashboard in a real headless Chromium, driven over the DevTools protocol (its pipe
transport, so nothing but the standard library and httpx is needed).

Usage: python dashboard.py http://127.0.0.1:PORT CHROMIUM [TOKEN]
With TOKEN (a broker with JWT auth), the page must first ask to sign in, then show the data once
the token is entered. Seeds its own data through the HTTP API, then checks that every view renders
it, that live data appears without a reload, and that a dead letter's requeue button works.
Exits non-zero on the first failed expectation.
"""
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

import httpx

URL, CHROMIUM = sys.argv[1], sys.argv[2]
TOKEN = sys.argv[3] if len(sys.argv) > 3 else None
HEADERS = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


class Browser:
    """Chromium with --remote-debugging-pipe: commands on its fd 3, answers on its fd 4, each
    message JSON ended by a NUL byte."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="queen-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        # Out of the way of 3 and 4, so the dup2s below cannot clobber each other.
        a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)

        def wire():
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (to_child_r, from_child_w, a, b):
            os.close(fd)
        self.buf = b""
        self.next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def page(self, method, params=None):
        return self.call(method, params, self.session)

    def eval(self, expression):
        r = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, what, timeout=15.0):
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.1)
        body = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''")
        raise AssertionError(f"timed out waiting for {what} ({expression} = {value!r}); page:\n{body}")

    def go(self, fragment):
        self.page("Page.navigate", {"url": f"{URL}/{fragment}"})

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        self.proc.wait(timeout=10)


def seed(http):
    q = f"dash-{uuid.uuid4().hex[:6]}"
    r = http.post("/api/v1/configure", json={"queue": q, "options": {"retryLimit": 0}})
    r.raise_for_status()
    items = [{"queue": q, "partition": f"p{i % 2}", "payload": {"order": i}, "transactionId": f"o{i}"} for i in range(6)]
    pushed = http.post("/api/v1/push", json={"items": items})
    pushed.raise_for_status()
    # Group billing reads and acks 2; queue mode dead-letters 2.
    for group, status, n in (("billing", "completed", 2), ("__QUEUE_MODE__", "failed", 2)):
        got = http.get(f"/api/v1/pop/queue/{q}/partition/p0", params={"batch": n, "wait": "false", "consumerGroup": group})
        check(got.status_code == 200, f"seed: {group} pops")
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": status, "error": "card declined"} for m in got.json()["messages"]]
        http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": group}).raise_for_status()
    traced = pushed.json()[1]
    r = http.post("/api/v1/traces", json={"transactionId": traced["transactionId"], "partitionId": traced["partitionId"],
                                          "consumerGroup": "billing", "traceNames": [f"{q}-trace"], "data": {"text": "charged the card"}})
    check(r.status_code == 201, "seed: a trace is stored")
    return q, traced["transactionId"]


def main():
    http = httpx.Client(base_url=URL, headers=HEADERS, timeout=10)
    q, traced_tx = seed(http)
    b = Browser()
    try:
        if TOKEN:
            b.go("#/queues")
            b.wait_for("(document.querySelector('#view-error') || {}).innerText", "the sign-in prompt")
            check("Sign in" in b.eval("document.querySelector('#view-error').innerText"), "without a token the page asks to sign in")
            b.eval(f"document.querySelector('#token').value = {json.dumps(TOKEN)}; document.querySelector('#save-token').click(); true")

        b.go("#/queues")
        row = b.wait_for(f"(document.querySelector('tr.queue-row[data-queue=\"{q}\"]') || {{}}).innerText", "the queue's row")
        check("6" in row, f"the queues page shows the queue with its 6 messages ({row!r})")

        b.go(f"#/queue/{q}")
        parts = b.wait_for("document.querySelectorAll('tr.partition-row').length", "the partitions")
        check(parts == 3, "the queue page lists its partitions (Default, p0, p1)")

        b.go("#/groups")
        row = b.wait_for("(document.querySelector('tr.group-row[data-group=\"billing\"]') || {}).innerText", "the group's row")
        check("4" in row, f"the groups page shows billing's lag of 4 ({row!r})")

        b.go(f"#/messages?queue={q}")
        n = b.wait_for("document.querySelectorAll('tr.message-row').length", "the message rows")
        check(n == 6, f"the message browser lists the 6 messages ({n})")
        b.eval(f"document.querySelector('tr.message-row[data-tx=\"{traced_tx}\"] td').click(); true")
        payload = b.wait_for("(document.querySelector('#message-payload') || {}).innerText", "the message detail")
        check('"order": 1' in payload, "clicking a message shows its payload")
        traces = b.wait_for("(document.querySelector('#message-traces') || {}).innerText", "the message's traces")
        check("charged the card" in traces, "and its traces")

        b.go(f"#/traces?name={q}-trace")
        row = b.wait_for("(document.querySelector('tr.trace-row') || {}).innerText", "a trace row")
        check("charged the card" in row, "the traces page finds the trace by name")

        b.go(f"#/dlq?queue={q}")
        n = b.wait_for("document.querySelectorAll('tr.dlq-row').length", "the dead letters")
        check(n == 2, "the dead-letter page lists the 2 dead letters")
        requeued_tx = b.eval("document.querySelector('tr.dlq-row').dataset.tx")
        b.eval("document.querySelector('button.requeue').click(); true")
        b.wait_for("document.querySelectorAll('tr.dlq-row').length === 1", "the requeued row to go")
        left = http.get("/api/v1/dlq", params={"queue": q}).json()
        check(left["total"] == 1, "the requeue removed the dead letter in storage")
        again = http.get(f"/api/v1/pop/queue/{q}/partition/p0", params={"batch": 10, "wait": "false"}).json()
        payloads = [m["data"] for m in again["messages"]]
        check(len(payloads) >= 1 and all(p is not None for p in payloads), "the requeued message is delivered again")
        check(any(m["transactionId"].endswith(requeued_tx) for m in again["messages"]), "under a requeue transactionId")

        b.go("#/")
        before = b.wait_for("(document.querySelector('#kpi-total .v') || {}).innerText", "the overview")
        http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "p9", "payload": {"late": i}} for i in range(5)]}).raise_for_status()
        after = b.wait_for(f"(() => {{ const v = (document.querySelector('#kpi-total .v') || {{}}).innerText; return v && v !== {json.dumps(before)} ? v : null; }})()",
                           "the overview to refresh by itself", timeout=20)
        check(after != before, f"live data appears without a reload ({before} -> {after})")
        points = b.wait_for("Number((document.querySelector('#live-rate svg') || {dataset: {}}).dataset.points || 0) >= 2 && document.querySelector('#live-rate polyline') !== null",
                            "the live chart", timeout=20)
        check(points, "the live throughput chart draws its series")
    finally:
        b.close()
    print("dashboard: all checks passed")


main()
