"""vLLM's waiting queues, replaced: the fair queue (`PolicyQueue`, the policy's order over
the driver), the queue of requests holding KV blocks while they wait (`HoldingQueue`),
and vLLM 0.34's asynchronous-load queue as a second door to the fair one
(`AsyncLoadQueue`). scheduler.py installs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import (
    RequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from vllm.v1.request import Request

from tokenfair.integrations.vllm.driver import PolicyDriver

Arrive = Callable[[Request, bool], None]


class PolicyQueue(RequestQueue):
    """vLLM's waiting-queue interface over the driver: the policy's order."""

    def __init__(
        self,
        driver: PolicyDriver[Request],
        arrive: Arrive,
        popped: list[Request],
        settle: Callable[[], None],
    ):
        self._driver = driver
        self._arrive = arrive
        self._popped = popped  # taken by schedule() and not settled yet
        self._settle = settle

    def add_request(self, request: Request) -> None:
        self._arrive(request, True)

    def pop_request(self) -> Request:
        if self._popped:
            self._settle()
        request = self._driver.pop()
        self._popped.append(request)
        return request

    def peek_request(self) -> Request:
        if self._popped:
            self._settle()  # charge this step's admissions before the next decision
        request = self._driver.peek()
        if request is None:
            raise IndexError("peek from an empty queue")
        return request

    def prepend_request(self, request: Request) -> None:
        # A preemption, or a request popped this step that was not admitted.
        if request.request_id not in self._driver:
            self._arrive(request, True)
        else:
            self._driver.put_back(request.request_id)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        # vLLM hands skipped requests newest-first: putting each at the front of its
        # tenant's queue in that order restores their original order.
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: Request) -> None:
        self._driver.remove(request.request_id)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._driver.remove(request.request_id)

    def __bool__(self) -> bool:
        return len(self._driver) > 0

    def __len__(self) -> int:
        return len(self._driver)

    def __iter__(self) -> Iterator[Request]:
        # In pop order, as vLLM's own queues iterate: code that walks the queue sees
        # what schedule() will take.
        return iter(list(self._driver.waiting()))

    def __getitem__(self, index: int) -> Request:
        # vLLM's FCFS queue is a deque, and vLLM code (and tests) index it.
        return list(self._driver.waiting())[index]


class ForwardingQueue(RequestQueue):
    """A `RequestQueue` that passes every call to another one (`inner`)."""

    def __init__(self, inner: RequestQueue):
        self._inner = inner

    def add_request(self, request: Request) -> None:
        self._inner.add_request(request)

    def pop_request(self) -> Request:
        return self._inner.pop_request()

    def peek_request(self) -> Request:
        return self._inner.peek_request()

    def prepend_request(self, request: Request) -> None:
        self._inner.prepend_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self._inner.prepend_requests(requests)

    def remove_request(self, request: Request) -> None:
        self._inner.remove_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        self._inner.remove_requests(requests)

    def __bool__(self) -> bool:
        return bool(self._inner)

    def __len__(self) -> int:
        return len(self._inner)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._inner)


class HoldingQueue(ForwardingQueue):
    """vLLM's own queue for block-holding waiters (FCFS or priority, as vLLM's loop
    runs), telling the driver what it holds and what schedule() takes from it."""

    def __init__(self, policy: SchedulingPolicy, arrive: Arrive, popped: list[Request]):
        super().__init__(create_request_queue(policy))
        self._arrive = arrive
        self._popped = popped

    def add_request(self, request: Request) -> None:
        self._arrive(request, False)
        super().add_request(request)

    def pop_request(self) -> Request:
        request = super().pop_request()
        self._popped.append(request)
        return request


class AsyncLoadQueue(ForwardingQueue):
    """vLLM's queue of requests that may load their KV asynchronously (vLLM 0.34's
    `async_kv_waiting`, with a KV connector and --max-num-inflight-kv-loads), as a
    second door to the fair queue.

    Its requests wait in the fair queue with everyone else's, and are lifted and
    charged alike. Through this door vLLM's loop sees the fair queue's head, so while
    the running batch is full it starts an asynchronous load when the request the
    policy picks next may load asynchronously, and waits otherwise: the order is the
    policy's, never arrival order across queues. It holds no request of its own, so
    vLLM's waiting count (which adds the queues) counts each request once.
    """

    def __len__(self) -> int:
        return 0  # its requests are counted in `waiting`

    def __iter__(self) -> Iterator[Request]:
        return iter(())
