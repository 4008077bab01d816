"""The contract every Agent-Reach SDK keeps, checked once for all of them.

Each SDK ships a small *conformance agent* (``README.md`` beside this file says what it
serves); this driver starts the real stack (etcd, Redis, registry, router with tasks,
context service: the Python SDK's test support), runs two instances of the agent as
processes, and checks the same expectations for every SDK:

- **assertion refused**: a delivery without the router's assertion, or with a forged one,
  is 401 ``UNAUTHENTICATED`` (``reason`` ``missing``, ``bad_signature``);
- **duplicate request id answered once**: a repeated ``request_id`` gets the first answer,
  the handler runs once;
- **deadline passed**: work whose deadline passed is 504 ``DEADLINE_EXCEEDED``, before it
  arrived (straight to the agent) or while it runs (through the router);
- **503 retried elsewhere**: an instance that answers "not now" sends the router to the
  other, the caller sees a success;
- **stream order**: a streamed capability's items arrive in order as events, then the
  router's result (and as a list to a caller that asked for none);
- **the 202 flow**: a task's delivery is answered 202 and its result reported later;
- **SIGTERM drains**: a call in flight when SIGTERM arrives is answered, the instance
  leaves the registry and the process exits 0.

Run as ``python sdk/contract/driver.py -- COMMAND...`` (COMMAND starts one conformance
agent), or :func:`run` from a test. The ``agent-reach`` binary comes from the cargo target
directory (``cargo build -p agent-reach-cli``), as for the Python SDK's tests. Exits non-zero
naming the first behaviour that failed, with the agents' logs.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import httpx  # noqa: E402 - after the path to the shared test support
from tests.support.keys import SigningKey  # noqa: E402
from tests.support.stack import Process, Stack, free_port, wait_until  # noqa: E402

#: The conformance agent's name (its token's ``sub``) and capabilities (README.md).
NAME = "contract_agent"
ECHO, SLOW, FLAKY, COUNT, TASK = (f"test.contract.{name}" for name in ("echo", "slow", "flaky", "count", "task"))
CAPABILITIES = (ECHO, SLOW, FLAKY, COUNT, TASK)


class Instance:
    """One conformance agent process, serving on its own loopback port."""

    def __init__(self, stack: Stack, command: Sequence[str], agent_id: str, *, unavailable: bool) -> None:
        self.agent_id = agent_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **stack.agent_env(NAME),
            "AGENT_REACH_LISTEN": f"127.0.0.1:{self.port}",
            "AGENT_REACH_ENDPOINT": self.url,
            "CONTRACT_AGENT_ID": agent_id,
            "CONTRACT_UNAVAILABLE": "1" if unavailable else "0",
        }
        self.process = Process(list(command), stack.directory / f"{agent_id}.log", env)

    def stop(self) -> None:
        self.process.stop()


class Contract:
    def __init__(self, stack: Stack, command: Sequence[str]) -> None:
        self.stack = stack
        self.command = command
        self.tester = {"authorization": f"Bearer {stack.token('tester')}"}
        self.instances: list[Instance] = []

    # === Helpers ===

    def start(self, agent_id: str, *, unavailable: bool) -> Instance:
        instance = Instance(self.stack, self.command, agent_id, unavailable=unavailable)
        self.instances.append(instance)
        for capability in CAPABILITIES:
            wait_until(
                lambda capability=capability: self.stack.routable(capability, agent_id),  # type: ignore[misc]
                60,
                f"{agent_id} routable for {capability} (log: {instance.process.tail()})",
            )
        return instance

    def invoke(self, capability: str, payload: Any, **fields: Any) -> httpx.Response:
        body = {"capability": capability, "payload": payload, **fields}
        return httpx.post(f"{self.stack.router.url}/v1/invoke", json=body, headers=self.tester, timeout=30)

    def deliver(self, instance: Instance, capability: str, payload: Any, **fields: Any) -> httpx.Response:
        """A delivery straight to ``instance``, as the router would make it (its key, its claims)."""
        authorization = fields.pop("authorization", None)
        if authorization is None:
            assertion = self.stack.assertion(audience=instance.agent_id, caller="tester", capability=capability)
            authorization = f"Bearer {assertion}"
        envelope = {
            "version": "1.0",
            "request_id": f"r-{time.monotonic_ns()}",
            "capability": capability,
            "capability_version": "1.0.0",
            "source": "tester",
            "priority": "normal",
            "deadline": int(time.time() * 1000) + 10_000,
            "attempt": 1,
            "payload": payload,
            **fields,
        }
        headers = {"authorization": authorization} if authorization else {}
        return httpx.post(f"{instance.url}/invoke", json=envelope, headers=headers, timeout=30)

    # === The behaviours ===

    def assertion_refused(self, instance: Instance) -> None:
        missing = self.deliver(instance, ECHO, {"text": "x"}, authorization="")
        expect_refusal(missing, "missing")
        # Signed with a key the router never published, under the router's own key id.
        forger = SigningKey(kid=self.stack.router_key.kid)
        forged = forger.assertion(audience=instance.agent_id, caller="tester", capability=ECHO)
        expect_refusal(self.deliver(instance, ECHO, {"text": "x"}, authorization=f"Bearer {forged}"), "bad_signature")

    def duplicate_answered_once(self, instance: Instance) -> None:
        first = self.deliver(instance, ECHO, {"text": "once"}, request_id="contract-dup-1")
        again = self.deliver(instance, ECHO, {"text": "once"}, request_id="contract-dup-1")
        fresh = self.deliver(instance, ECHO, {"text": "once"}, request_id="contract-dup-2")
        for answer in (first, again, fresh):
            check(answer.status_code == 200, f"echo answered {answer.status_code}: {answer.text}")
        check(first.json() == again.json(), f"a repeated request id answered anew: {first.text} then {again.text}")
        runs = first.json()["output"]["runs"]
        check(fresh.json()["output"]["runs"] == runs + 1, f"the repeat ran the handler again: {fresh.text}")

    def deadline_passed(self, instance: Instance) -> None:
        late = self.deliver(instance, ECHO, {"text": "late"}, deadline=int(time.time() * 1000) - 1)
        check(late.status_code == 504, f"a delivery past its deadline answered {late.status_code}: {late.text}")
        check(late.json()["error"]["code"] == "DEADLINE_EXCEEDED", late.text)
        slow = self.invoke(SLOW, {"ms": 3000}, timeout_ms=400)
        check(slow.status_code == 504, f"work past its deadline answered {slow.status_code}: {slow.text}")
        check(slow.json()["error"]["code"] == "DEADLINE_EXCEEDED", slow.text)

    def unavailable_retried_elsewhere(self, down: Instance, up: Instance) -> None:
        direct = self.deliver(down, FLAKY, {})
        check(direct.status_code == 503, f"the unavailable instance answered {direct.status_code}: {direct.text}")
        attempts = []
        for _ in range(6):
            answer = self.invoke(FLAKY, {})
            check(answer.status_code == 200, f"a call that met a 503 failed: {answer.text}")
            envelope = answer.json()
            check(envelope["output"] == {"agent_id": up.agent_id}, f"answered by the wrong instance: {answer.text}")
            attempts.append(envelope["attempts"])
        check(2 in attempts, f"no call was retried on the other instance (attempts {attempts})")

    def stream_order(self) -> None:
        with httpx.stream(
            "POST",
            f"{self.stack.router.url}/v1/invoke",
            json={"capability": COUNT, "payload": {"n": 5}},
            headers={**self.tester, "accept": "text/event-stream"},
            timeout=30,
        ) as response:
            check(response.status_code == 200, f"stream answered {response.status_code}")
            events = parse_events("".join(response.iter_text()))
        items = [json.loads(data) for name, data in events if name == "message"]
        check(items == [{"i": i} for i in range(5)], f"items out of order or missing: {events}")
        check(events[-1][0] == "result", f"the stream did not end with the router's result: {events}")
        check(json.loads(events[-1][1])["status"] == "succeeded", events[-1][1])
        whole = self.invoke(COUNT, {"n": 3})
        check(whole.json().get("output") == [{"i": 0}, {"i": 1}, {"i": 2}], f"as a list: {whole.text}")

    def accepted_then_reported(self) -> None:
        submitted = httpx.post(
            f"{self.stack.router.url}/v1/tasks",
            json={"capability": TASK, "payload": {"text": "later"}},
            headers=self.tester,
            timeout=30,
        )
        check(submitted.status_code == 202, f"task submission answered {submitted.status_code}: {submitted.text}")
        task_id = submitted.json()["task_id"]
        view: dict[str, Any] = {}

        def done() -> bool:
            nonlocal view
            view = httpx.get(f"{self.stack.router.url}/v1/tasks/{task_id}", headers=self.tester, timeout=10).json()
            return view.get("status") in ("succeeded", "failed", "canceled")

        wait_until(done, 30, f"task {task_id} to finish")
        check(view["status"] == "succeeded", f"the task did not succeed: {view}")
        check((view.get("result") or {}).get("output") == {"text": "LATER"}, f"reported result: {view}")
        states = [transition.get("status") for transition in view.get("transitions") or []]
        check("running" in states or states == [], f"transitions: {states}")

    def sigterm_leaves(self, instance: Instance) -> None:
        instance.process.signal(signal.SIGTERM)
        code = instance.process.wait(30)
        check(code == 0, f"the agent exited {code} after SIGTERM: {instance.process.tail()}")
        check(self.stack.instance(instance.agent_id) is None, "the stopped instance is still registered")

    def sigterm_drains(self, instance: Instance) -> None:
        """``instance`` is the only one left: a slow call reaches it, then SIGTERM."""
        answered: list[httpx.Response] = []
        call = threading.Thread(target=lambda: answered.append(self.invoke(SLOW, {"ms": 1500})))
        call.start()
        metric = f'agent_reach_router_inflight{{agent_id="{instance.agent_id}"}} 1'
        wait_until(lambda: metric in httpx.get(f"{self.stack.router.url}/metrics").text, 10, "the slow call in flight")
        instance.process.signal(signal.SIGTERM)
        call.join(30)
        check(bool(answered), "the call in flight was not answered")
        check(answered[0].status_code == 200, f"the call in flight at SIGTERM failed: {answered[0].text}")
        check(answered[0].json()["output"] == {"slept": 1500}, answered[0].text)
        code = instance.process.wait(30)
        check(code == 0, f"the agent exited {code} after SIGTERM: {instance.process.tail()}")
        check(self.stack.instance(instance.agent_id) is None, "the drained instance is still registered")

    def run(self, report: Callable[[str], None]) -> None:
        down = self.start("contract-down", unavailable=True)
        up = self.start("contract-up", unavailable=False)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("assertion refused", lambda: self.assertion_refused(up)),
            ("duplicate request id answered once", lambda: self.duplicate_answered_once(up)),
            ("deadline passed", lambda: self.deadline_passed(up)),
            ("503 retried elsewhere", lambda: self.unavailable_retried_elsewhere(down, up)),
            ("stream order", self.stream_order),
            ("the 202 flow", self.accepted_then_reported),
            ("SIGTERM leaves", lambda: self.sigterm_leaves(down)),
            ("SIGTERM drains", lambda: self.sigterm_drains(up)),
        ]
        for name, step in steps:
            try:
                step()
            except AssertionError as error:
                logs = "\n".join(f"--- {i.agent_id}:\n{i.process.tail(40)}" for i in self.instances)
                raise AssertionError(f"contract: {name}: {error}\n{logs}") from error
            report(f"contract ok: {name}")

    def stop(self) -> None:
        for instance in self.instances:
            instance.stop()


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def expect_refusal(answer: httpx.Response, reason: str) -> None:
    check(answer.status_code == 401, f"expected 401 ({reason}), got {answer.status_code}: {answer.text}")
    error = answer.json().get("error") or {}
    check(error.get("code") == "UNAUTHENTICATED", f"expected UNAUTHENTICATED: {answer.text}")
    check((error.get("details") or {}).get("reason") == reason, f"expected reason {reason}: {answer.text}")


def parse_events(text: str) -> list[tuple[str, str]]:
    """Server-sent events as (event name, data), in order."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def run(command: Sequence[str], stack: Stack | None = None, report: Callable[[str], None] = print) -> None:
    """Checks the contract with agents started by ``command`` (on ``stack``, else a stack of its own)."""
    own = stack is None
    stack = stack or Stack()
    contract = Contract(stack, command)
    try:
        contract.run(report)
    finally:
        contract.stop()
        if own:
            stack.stop()


def main(argv: Sequence[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: driver.py -- COMMAND... (starts one conformance agent; see sdk/contract/README.md)")
        return 2
    command = list(argv[argv.index("--") + 1 :])
    started = time.monotonic()
    try:
        run(command)
    except AssertionError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"contract: every behaviour held for {' '.join(command)} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
