"""Replica restarts in the router: a replica lost mid-call is replaced in its place by one serving the
others' weights, its share re-issued with the same seeds gives the tokens an uninterrupted router
gives; concurrent losses restart once; the limit stops with the count; without restarts the loss is
raised as before. Real torch engines in this process; the loss is a replica that stops serving."""

import asyncio

import pytest

from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.replica_restarts import ReplicaLost, ReplicaRestarts
from stratarl.rollout.router import RolloutRouter
from stratarl.rollout.weight_sync import push_weights
from tests.rollout.test_torch_engine import PROMPTS
from tests.rollout.tiny_lm import build_tiny_qwen2


class Lost(ReplicaLost):
    pass


class Dies:
    """An engine that serves until `die()`, then loses every call, as a killed replica process does."""

    def __init__(self, engine, *, fails_after: int | None = None):
        self.engine, self.replica_id = engine, engine.replica_id
        self.calls, self.fails_after = 0, fails_after

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _lost(self) -> bool:
        self.calls += 1
        return self.fails_after is not None and self.calls > self.fails_after

    def generate(self, requests):
        if self._lost():
            raise Lost("replica died", replica_id=self.replica_id, cause="died", why="died (SIGKILL)")
        return self.engine.generate(requests)

    async def generate_async(self, request):
        await asyncio.sleep(0)  # the sessions all reach the replica before it answers
        if self._lost():
            raise Lost("replica died", replica_id=self.replica_id, cause="died", why="died (SIGKILL)")
        return await self.engine.generate_async(request)


def trained_state():
    return build_tiny_qwen2(seed=5).state_dict()  # "the actor's weights" of version 1


def requests():
    """3 groups of 4 samples, each its own seed (what `generation_requests` gives a step's rows)."""
    return [
        GenerationRequest(
            f"r{4 * g + k}", PROMPTS[g], SamplingParams(temperature=1.0, max_tokens=8, seed=4 * g + k)
        )
        for g in range(3)
        for k in range(4)
    ]


@pytest.fixture
def replicas(make_engine):
    """Three replicas built from the model directory (seed 0), then synced to version 1."""

    def make(fails_after: dict[int, int] | None = None):
        engines = [make_engine(build_tiny_qwen2(seed=0), replica_id=i) for i in range(3)]
        push_weights(trained_state(), engines, version=1)
        return [Dies(e, fails_after=(fails_after or {}).get(i)) for i, e in enumerate(engines)]

    return make


@pytest.fixture
def start_again(make_engine):
    """The restart: a new engine from the model directory, given version 1 as a weight sync gives it."""
    started = []

    def start(lost):
        engine = make_engine(build_tiny_qwen2(seed=0), replica_id=lost.replica_id)
        push_weights(trained_state(), [engine], version=lost.weight_version)
        started.append(lost.replica_id)
        return Dies(engine)

    start.started = started
    return start


def test_a_replica_lost_mid_generate_is_replaced_and_its_share_gives_the_same_tokens(replicas, start_again):
    expected = RolloutRouter(replicas()).generate(requests())
    restarts = ReplicaRestarts(2, start_again)
    router = RolloutRouter(replicas(fails_after={1: 0}), restarts=restarts)  # replica 1 dies at once
    got = router.generate(requests())
    assert [r.response_ids for r in got] == [r.response_ids for r in expected]
    flat = [p for r in got for p in r.log_probs]
    assert flat == pytest.approx([p for r in expected for p in r.log_probs], abs=1e-6)
    assert {r.replica_id for r in got[4:8]} == {1} and {r.weight_version for r in got} == {1}
    (restart,) = restarts.take()
    assert (restart.replica_id, restart.cause, restart.number, restart.weight_version) == (1, "died", 1, 1)
    assert restarts.take() == [] and restarts.used == 1 and start_again.started == [1]
    assert router.weight_version == 1 and router.replicas[1].calls == 1  # the new one served the share


def test_restarts_used_up_stop_with_the_count(replicas, start_again):
    router = RolloutRouter(replicas(fails_after={0: 0, 2: 0}), restarts=ReplicaRestarts(1, start_again))
    with pytest.raises(ReplicaLost, match=r"replica died; 1 of 1 replica restarts used") as lost:
        router.generate(requests())
    assert lost.value.why == "died (SIGKILL)" and lost.value.cause == "died"
    assert lost.value.replica_id in (0, 2) and start_again.started in ([0], [2])


def test_without_restarts_the_loss_is_raised_as_before(replicas):
    with pytest.raises(Lost, match="replica died"):
        RolloutRouter(replicas(fails_after={0: 0})).generate(requests())
    with pytest.raises(ReplicaLost, match=r"0 of 0 replica restarts used"):
        RolloutRouter(replicas(fails_after={0: 0}), restarts=ReplicaRestarts(0, print)).generate(requests())


def test_sessions_lost_together_restart_their_replica_once(make_engine, start_again):
    """Four agent sessions in flight on one replica when it dies: one restart, each re-issued there."""
    engine = make_engine(build_tiny_qwen2(seed=0), replica_id=0)
    push_weights(trained_state(), [engine], version=1)
    restarts = ReplicaRestarts(3, start_again)
    router = RolloutRouter([Dies(engine, fails_after=0)], restarts=restarts)
    reference = RolloutRouter([Dies(make_engine(build_tiny_qwen2(seed=5), replica_id=0))])

    async def sessions(r):
        return await asyncio.gather(*(r.generate_async(q) for q in requests()[:4]))

    got, expected = asyncio.run(sessions(router)), asyncio.run(sessions(reference))
    assert [r.response_ids for r in got] == [r.response_ids for r in expected]
    assert restarts.used == 1 and start_again.started == [0]
