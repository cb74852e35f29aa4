"""Layer 5, rollout: several engine replicas behind one engine interface, least-loaded with sticky sessions.

Routing rule for each request, in order:
  1. a session already served stays on its replica (every turn of a trajectory goes to the same
     replica, whose `PrefixStore` holds the session's KV);
  2. in a batch, requests with the same prompt (a GRPO group) go together to one replica, so the
     prompt is prefilled once there;
  3. otherwise the replica with the least load: requests in flight through this router, plus
     those placed earlier in the same batch.
A batch's shares run concurrently: one in the calling thread, each other one on a thread of its own
(in-process engines) or as a call to its process (Ray replicas). Weight sync goes to every replica,
checked per replica. With `restarts` (`replica_restarts.ReplicaRestarts`), a replica lost during a
call (`ReplicaLost`) is replaced in its place and the call runs again there, the same requests with
the same seeds.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from torch import Tensor

from stratarl.rollout.interface import GenerationRequest, GenerationResult
from stratarl.rollout.replica_restarts import ReplicaLost, ReplicaRestarts
from stratarl.rollout.weight_sync import DEFAULT_BUCKET_BYTES, WeightLoadReport, WeightSyncError, push_weights

T = TypeVar("T")


class Replica(Protocol):
    """An engine the router can use (`TorchRolloutEngine`, `VllmRolloutEngine`)."""

    replica_id: int

    @property
    def weight_version(self) -> int: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    async def generate_async(self, request: GenerationRequest) -> GenerationResult: ...


class RolloutRouter:
    """A `RolloutEngine` that spreads requests over `replicas` (whose replica ids must differ).

    max_sessions: sessions remembered for stickiness (least recently used forgotten first).
    restarts: replaces a replica lost during a call (None: the loss is raised). A replacement keeps
        the lost replica's index, so its sessions stay there (their KV is prefilled again).
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        max_sessions: int = 100_000,
        restarts: ReplicaRestarts | None = None,
    ) -> None:
        ids = [r.replica_id for r in replicas]
        if not replicas or len(set(ids)) != len(ids):
            raise ValueError(f"a router needs at least one replica, with distinct replica ids; got {ids}")
        self.replicas = list(replicas)
        self.max_sessions = max_sessions
        self._in_flight = [0] * len(replicas)
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self.restarts = restarts

    @property
    def weight_version(self) -> int:
        """The version every replica serves (a replica lost since its last call is restarted first,
        with restarts)."""
        versions = {self._with_restarts(i, lambda r: r.weight_version) for i in range(len(self.replicas))}
        if len(versions) != 1:
            raise WeightSyncError(f"replicas serve different weight versions: {sorted(versions)}")
        return versions.pop()

    @property
    def in_flight(self) -> list[int]:
        return list(self._in_flight)

    def replica_for_session(self, session_id: str) -> int | None:
        return self._sessions.get(session_id)

    # --- routing -------------------------------------------------------------------------------
    def route(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """The replica index of each request (rules in the module doc); counts them as in flight."""
        with self._lock:
            load = list(self._in_flight)
            by_prompt: dict[tuple[int, ...], int] = {}
            chosen = []
            for request in requests:
                index = self._sessions.get(request.session_id) if request.session_id is not None else None
                if index is None:
                    index = by_prompt.get(request.prompt_ids)
                if index is None:
                    index = min(range(len(load)), key=lambda i: (load[i], i))
                by_prompt.setdefault(request.prompt_ids, index)
                if request.session_id is not None:
                    self._remember(request.session_id, index)
                load[index] += 1
                chosen.append(index)
            self._in_flight = load
            return chosen

    def _remember(self, session_id: str, index: int) -> None:
        self._sessions[session_id] = index
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def _done(self, index: int, count: int = 1) -> None:
        with self._lock:
            self._in_flight[index] -= count

    # --- generation ----------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Route the batch, run each replica's share concurrently; results in request order."""
        results: list[GenerationResult | None] = [None] * len(requests)
        for positions, share in self.run_shares(requests, lambda replica, part: replica.generate(part)):
            for position, result in zip(positions, share, strict=True):
                results[position] = result
        return results  # type: ignore[return-value]

    def run_shares(
        self, requests: Sequence[GenerationRequest], work: Callable[[Replica, list[GenerationRequest]], T]
    ) -> list[tuple[list[int], T]]:
        """Route the batch and run `work(replica, its requests)` for every replica concurrently;
        returns (positions of its requests in the batch, work's output) per replica used."""
        shares: dict[int, list[int]] = {}
        for position, index in enumerate(self.route(requests)):
            shares.setdefault(index, []).append(position)

        def run(index: int) -> tuple[list[int], T]:
            share = [requests[p] for p in shares[index]]
            try:
                return shares[index], self._with_restarts(index, lambda replica: work(replica, share))
            finally:
                self._done(index, len(shares[index]))

        # The last share runs in the calling thread, the others on threads of their own. A single
        # in-process replica thus generates in the trainer's thread: a second thread that runs torch
        # kernels, even one waited on, makes OpenMP (GNU libgomp) count more threads than cores and
        # switch every team to short spins, after which each small decode kernel waits for a futex
        # wake-up. Measured (docs/benchmarks.md, "Quiet machine, generation on the calling thread,
        # host allocator"): 10M, 64 rows × 32 tokens, 0.70 s in the caller, 1.47 s on a pool thread.
        if not shares:
            return []
        *others, last = shares
        with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
            futures = [pool.submit(run, index) for index in others]
            own = run(last)
            return [*(future.result() for future in futures), own]

    def _with_restarts(self, index: int, call: Callable[[Replica], T]) -> T:
        """call(replica `index`), again on its replacement each time the replica is lost."""
        while True:
            replica = self.replicas[index]
            try:
                return call(replica)
            except ReplicaLost as error:
                if self.restarts is None:
                    raise
                self.restarts.replace(self.replicas, index, replica, error)

    async def generate_async(self, request: GenerationRequest) -> GenerationResult:
        (index,) = self.route([request])
        try:
            while True:
                replica = self.replicas[index]
                try:
                    return await replica.generate_async(request)
                except ReplicaLost as error:
                    if self.restarts is None:
                        raise
                    # Starting a replica takes seconds: off the event loop, whose other sessions go on.
                    await asyncio.to_thread(self.restarts.replace, self.replicas, index, replica, error)
        finally:
            self._done(index)

    # --- weights -------------------------------------------------------------------------------
    def load_weights(
        self,
        state_dict: Mapping[str, Tensor],
        version: int,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        partial: bool = False,
    ) -> list[WeightLoadReport]:
        """Push to every replica in buckets; each must then serve `version` with what was sent."""
        return push_weights(
            state_dict, self.replicas, version=version, bucket_bytes=bucket_bytes, partial=partial
        )
