"""Layer 5, rollout: the batch and async APIs of a step-driven engine, shared by the torch and vLLM backends.

A backend says how to queue requests, whether it has work, and how to run one step (which returns
the requests it finished). On top of that:
- `generate(requests)`: queue all, then step in the calling thread until all are done;
- `await generate_async(request)`: queue one and make sure a background thread is stepping, so an
  event loop can await many sessions at once while the model runs (torch releases the GIL);
- both may run at once: steps are serialized by one lock, and whichever thread steps resolves the
  futures of the requests that finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from stratarl.rollout.interface import GenerationRequest, GenerationResult

Finished = list[tuple[Future, GenerationResult]]
IDLE_WAIT_S = 0.001  # how long `generate` sleeps when it has nothing to step, instead of spinning


class SteppedEngine:
    """Base of the engines: subclasses implement `_enqueue`, `_can_step`, `_step`, `_fail_all`
    (and may refine `_validate`, `_blocked_reason`)."""

    replica_id: int = 0

    def __init__(self) -> None:
        self._step_lock = threading.Lock()  # one step (or weight update) at a time
        self._driver_lock = threading.Lock()
        self._driver: threading.Thread | None = None

    # --- what a backend provides -----------------------------------------------------------------
    def _validate(self, requests: Sequence[GenerationRequest]) -> None:
        """Raise before anything is queued if a request cannot run here."""

    def _enqueue(self, pairs: list[tuple[GenerationRequest, Future]]) -> None:
        raise NotImplementedError

    def _can_step(self) -> bool:
        raise NotImplementedError

    def _step(self) -> Finished:
        raise NotImplementedError

    def _fail_all(self, error: BaseException) -> None:
        raise NotImplementedError

    def _blocked_reason(self) -> str | None:
        """Why requests cannot progress now (e.g. a weight update in progress), or None."""
        return None

    # --- the APIs --------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future]:
        """Queue requests (validated first, all or none); each future resolves to its result."""
        self._validate(requests)
        futures: list[Future] = [Future() for _ in requests]
        self._enqueue(list(zip(requests, futures, strict=True)))
        return futures

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """The batch API: submit all, step until all are done; results in request order."""
        futures = self.submit(requests)
        while not all(f.done() for f in futures):
            reason = self._blocked_reason()
            if reason is not None:
                raise RuntimeError(reason)
            with self._step_lock:
                stepped = self._can_step()
                if stepped:
                    self._run_step()
            if not stepped:  # nothing to step here (a driver holds the rows, or weights arrive)
                time.sleep(IDLE_WAIT_S)
        return [f.result() for f in futures]

    async def generate_async(self, request: GenerationRequest) -> GenerationResult:
        """The async API: many sessions await their turns at once; a background thread steps."""
        future = self.submit([request])[0]
        self._start_driver()
        return await asyncio.wrap_future(future)

    # --- stepping --------------------------------------------------------------------------------
    def _run_step(self) -> None:
        """One step; the caller holds `_step_lock`. A failing step fails every request it held."""
        try:
            finished = self._step()
        except BaseException as error:
            self._fail_all(error)
            raise
        for future, result in finished:
            future.set_result(result)

    def _start_driver(self) -> None:
        with self._driver_lock:
            if self._driver is None:
                name = f"rollout-replica-{self.replica_id}"
                self._driver = threading.Thread(target=self._drive, name=name, daemon=True)
                self._driver.start()

    def _drive(self) -> None:
        while True:
            with self._driver_lock:
                if not self._can_step():
                    self._driver = None
                    return
            # a failed step already handed its error to the futures of the requests it failed
            with self._step_lock, contextlib.suppress(Exception):
                self._run_step()

    def _step_until(self, condition) -> None:
        """Step (in this thread, alongside any driver) until `condition()` holds."""
        while not condition():
            with self._step_lock:
                if not condition() and self._can_step():
                    self._run_step()
