"""Layer 5, agent gateway: every request in flight goes to the engine in one `generate` call.

HTTP handlers `await batcher.generate(requests)`; one loop takes whatever is queued — all requests
that arrived while the engine was busy, plus those arriving within `BATCH_WINDOW_S` of the first —
and submits them together, so 64 episodes calling at once become one engine batch, not 64. The
engine call runs in a thread: the event loop keeps accepting connections (and running the agents)
while it generates. `batch_sizes` records how many requests each engine call carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stratarl.rollout.interface import GenerationRequest, GenerationResult, RolloutEngine

# How long the first request of a batch waits for others: requests of agents that were answered in
# the same engine call arrive a few event-loop turns apart, not at once.
BATCH_WINDOW_S = 0.005


class EngineBatcher:
    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.batch_sizes: list[int] = []
        self._queue: asyncio.Queue[tuple[list[GenerationRequest], asyncio.Future]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """The results of `requests`, in order, from a shared engine call."""
        return await self.submit(requests)

    def submit(self, requests: Sequence[GenerationRequest]) -> asyncio.Future:
        """A future of the results of `requests`; cancelling it before its engine call starts drops
        them from the batch (after, the engine's answer for them is discarded)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((list(requests), future))
        return future

    async def _run(self) -> None:
        while True:
            groups = [await self._queue.get()]
            await asyncio.sleep(BATCH_WINDOW_S)
            while not self._queue.empty():
                groups.append(self._queue.get_nowait())
            groups = [(requests, future) for requests, future in groups if not future.cancelled()]
            flat = [request for requests, _ in groups for request in requests]
            if not flat:
                continue
            self.batch_sizes.append(len(flat))
            try:
                results = await asyncio.to_thread(self.engine.generate, flat)
            except Exception as err:  # every waiting request fails with it; the loop goes on
                for _, future in groups:
                    if not future.done():
                        future.set_exception(err)
                continue
            position = 0
            for requests, future in groups:
                if not future.done():  # a cancelled episode's answer is dropped
                    future.set_result(results[position : position + len(requests)])
                position += len(requests)
