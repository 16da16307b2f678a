"""A light HTTP load generator for OpenAI-compatible servers (its own process).

Raw asyncio connections with keep-alive, pre-encoded requests and httptools parsing, so
the client costs as little CPU as possible on a machine it shares with the server.

- Closed loop (the default): C workers each send one request at a time, for N requests
  in all or for D seconds. Each worker sends its next request the moment the last one
  ends, so arrivals bunch up right after the server's bursts of ends.
- Open loop (`--rate R`): N requests at Poisson arrival times, R a second on average
  (seeded: `--seed`), each on an idle keep-alive connection or a new one, whatever the
  server's pace, as independent users arrive; at most C in flight (a request that finds
  C in flight waits, and `waited_for_cap` counts it).

    python benchmarks/server_tools/loadgen.py --url http://127.0.0.1:8000 --model sim:zero \
        --concurrency 64 --requests 5000 --max-tokens 4 [--stream] [--key KEY] [--rate 400]

Prints one JSON line: requests/s, output tokens/s, latency and TTFT percentiles
(seconds), errors by status. --max-tokens-min draws each request's max_tokens
uniformly from [min, --max-tokens] (seeded per worker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httptools

TEXT = re.compile(rb'"(?:text|content)":\s*"[^"]')  # a chunk with generated text
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
RESPONSE_ID = re.compile(rb'"id":\s*"([^"]+)"')


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    # (response id, latency, ttft or None) per request, for --ids-out
    records: list[tuple[str, float, float | None]] = field(default_factory=list)
    keep_records: bool = False


def request_bytes(host: str, args: argparse.Namespace, prompt: str, max_tokens: int) -> bytes:
    body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {args.key}\r\n" if args.key else ""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


class Connection(asyncio.Protocol):
    """One keep-alive connection; httptools (C) parses responses as bytes arrive, so a
    streamed chunk costs one callback, not a round of StreamReader awaits."""

    def __init__(self, keep_body: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.keep_body = keep_body
        self.done: asyncio.Future[None] | None = None
        self.open = True
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.first: float | None = None
        self.finished_at = 0.0
        self.head_body = b""  # the first piece of the body: it carries the response id
        self.parts: list[bytes] = []  # every piece (keep_body), else the last two

    def send(self, payload: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self._reset()
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.done

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(ConnectionError(f"bad response: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(ConnectionError("connection closed"))

    def _fail(self, error: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(error)

    # --- httptools callbacks ---
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.head_body:
            self.head_body = body
        if self.first is None and TEXT.search(body):
            self.first = time.perf_counter()
        self.parts.append(body)
        if not self.keep_body and len(self.parts) > 2:
            del self.parts[0]

    def on_message_complete(self) -> None:
        self.finished_at = time.perf_counter()
        if not self.parser.should_keep_alive():
            self.open = False
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


def record(connection: Connection, started: float, tally: Tally) -> None:
    """Tally one finished response."""
    if connection.status != 200:
        tally.errors[connection.status] += 1
        return
    tally.latencies.append(connection.finished_at - started)
    first = connection.first
    if first is not None:
        tally.ttfts.append(first - started)
    tail = b"".join(connection.parts)
    if tally.keep_records:  # only with --ids-out: the client stays as cheap as it can
        found = RESPONSE_ID.search(connection.head_body) or RESPONSE_ID.search(tail)
        if found:
            ttft = None if first is None else first - started
            tally.records.append((found.group(1).decode(), connection.finished_at - started, ttft))
    counts = COMPLETION_TOKENS.findall(tail)
    if counts:
        tally.tokens += int(counts[-1])


async def worker(
    args: argparse.Namespace, tally: Tally, budget: list[int], deadline: float, index: int
) -> None:
    host, port = args.url.removeprefix("http://").split(":")
    prompt = args.prompt or f"request from worker {index} " * args.prompt_words
    payload = request_bytes(host, args, prompt, args.max_tokens)
    rng = random.Random(index)
    loop = asyncio.get_running_loop()
    if args.stagger:  # start at different moments, so arrivals spread out like real traffic
        await asyncio.sleep(rng.uniform(0, args.stagger))
    connection: Connection | None = None
    while budget[0] > 0 and time.perf_counter() < deadline:
        budget[0] -= 1
        if connection is None or not connection.open:
            _, connection = await loop.create_connection(
                lambda: Connection(tally.keep_records), host, int(port)
            )
        if args.max_tokens_min is not None:  # lengths vary, as in real traffic
            payload = request_bytes(
                host, args, prompt, rng.randint(args.max_tokens_min, args.max_tokens)
            )
        started = time.perf_counter()
        try:
            await connection.send(payload)
        except ConnectionError:
            tally.errors[0] += 1
            connection = None
            continue
        record(connection, started, tally)
    if connection is not None and connection.transport is not None:
        connection.transport.close()


class Pool:
    """Idle keep-alive connections to one server, shared by the open loop's requests."""

    def __init__(self, host: str, port: int, keep_body: bool) -> None:
        self.host, self.port, self.keep_body = host, port, keep_body
        self.idle: list[Connection] = []

    async def take(self) -> Connection:
        while self.idle:
            connection = self.idle.pop()
            if connection.open:
                return connection
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: Connection(self.keep_body), self.host, self.port
        )
        return connection

    def give_back(self, connection: Connection) -> None:
        if connection.open:
            self.idle.append(connection)

    def close(self) -> None:
        for connection in self.idle:
            if connection.transport is not None:
                connection.transport.close()


async def open_loop(args: argparse.Namespace, tally: Tally, deadline: float) -> int:
    """--requests requests at Poisson arrival times; returns how many waited for the cap."""
    host, port = args.url.removeprefix("http://").split(":")
    rng = random.Random(args.seed)
    pool = Pool(host, int(port), tally.keep_records)
    gate = asyncio.Semaphore(args.concurrency)
    in_flight: set[asyncio.Task[None]] = set()
    waited = 0

    async def one(payload: bytes) -> None:
        try:
            connection = await pool.take()
            started = time.perf_counter()
            await connection.send(payload)
        except OSError:  # refused, or closed before the response ended
            tally.errors[0] += 1
            return
        finally:
            gate.release()
        record(connection, started, tally)
        pool.give_back(connection)

    arrival = time.perf_counter()
    for index in range(args.requests):
        arrival += rng.expovariate(args.rate)
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() >= deadline:
            break
        if gate.locked():
            waited += 1
        await gate.acquire()
        low = args.max_tokens_min if args.max_tokens_min is not None else args.max_tokens
        prompt = args.prompt or f"request number {index} " * args.prompt_words
        payload = request_bytes(host, args, prompt, rng.randint(low, args.max_tokens))
        task = asyncio.create_task(one(payload))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)
    pool.close()
    return waited


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def main(args: argparse.Namespace) -> dict[str, object]:
    tally = Tally(keep_records=bool(args.ids_out))
    budget = [args.requests]
    started = time.perf_counter()
    deadline = started + args.duration
    if args.rate is not None:
        workers: asyncio.Future[Any] = asyncio.ensure_future(open_loop(args, tally, deadline))
    else:
        workers = asyncio.gather(
            *(worker(args, tally, budget, deadline, i) for i in range(args.concurrency))
        )
    cut_short = False
    try:  # requests still in flight at the deadline are dropped, not waited for
        await asyncio.wait_for(workers, timeout=min(args.duration + 1, 1e8))
    except TimeoutError:
        cut_short = True
    elapsed = time.perf_counter() - started
    done = len(tally.latencies)
    result = {
        "label": args.label,
        "concurrency": args.concurrency,
        "stream": args.stream,
        "max_tokens": args.max_tokens,
        "requests": done,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(done / elapsed, 1),
        "output_tokens_per_s": round(tally.tokens / elapsed, 1),
        "latency_p50_s": pct(tally.latencies, 50),
        "latency_p99_s": pct(tally.latencies, 99),
        "ttft_p50_s": pct(tally.ttfts, 50),
        "ttft_p90_s": pct(tally.ttfts, 90),
        "ttft_p99_s": pct(tally.ttfts, 99),
        "errors": dict(tally.errors),
        "cut_short_at_duration": cut_short,
    }
    if args.rate is not None:
        result["rate_per_s"] = args.rate
        finished = workers.done() and not workers.cancelled()
        result["waited_for_cap"] = workers.result() if finished else None
    if args.ids_out:
        with open(args.ids_out, "w") as out:
            for rid, latency, ttft in tally.records:
                out.write(json.dumps({"id": rid, "latency_s": latency, "ttft_s": ttft}) + "\n")
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--key", default=None)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=1e9, help="stop after this many seconds")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--max-tokens-min",
        type=int,
        default=None,
        help="draw max_tokens uniformly from [this, --max-tokens]",
    )
    parser.add_argument("--prompt", default=None)
    parser.add_argument("--prompt-words", type=int, default=4)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--stagger", type=float, default=0.0, help="each worker starts after U(0, this) seconds"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop: Poisson arrivals, this many a second on average (--concurrency caps "
        "the requests in flight)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the open loop's arrivals and lengths")
    parser.add_argument(
        "--ids-out", default=None, help="write each request's id, latency and TTFT (JSON lines)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    try:
        import uvloop

        result = uvloop.run(main(arguments))
    except ImportError:
        result = asyncio.run(main(arguments))
    print(json.dumps(result), flush=True)
