"""The async API (many sessions awaited at once give the batch results) and the replica router: every
result records its replica, least-loaded placement, a prompt group kept on one replica, sticky
sessions across turns, and weight sync to all replicas."""

import asyncio

import pytest

from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.router import RolloutRouter
from tests.rollout.test_torch_engine import PROMPTS
from tests.rollout.tiny_lm import build_tiny_qwen2


def seeded(i: int, prompt, session=None) -> GenerationRequest:
    return GenerationRequest(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=6, seed=i), session)


def test_async_sessions_give_the_batch_results(tiny_model, make_engine):
    requests = [seeded(i, PROMPTS[i % 4]) for i in range(10)]
    batch = make_engine(tiny_model).generate(requests)
    engine = make_engine(tiny_model)

    async def agents():
        return await asyncio.gather(*(engine.generate_async(r) for r in requests))

    concurrent = asyncio.run(agents())
    assert [r.request_id for r in concurrent] == [r.request_id for r in batch]
    assert [r.response_ids for r in concurrent] == [r.response_ids for r in batch]


def test_an_agent_loop_runs_multi_turn_sessions_concurrently(tiny_model, make_engine):
    engine = make_engine(tiny_model)

    async def session(k: int) -> list[int]:
        prompt = list(PROMPTS[k % 4])
        for turn in range(3):
            result = await engine.generate_async(seeded(10 * k + turn, prompt, session=f"s{k}"))
            prompt += [*result.response_ids, 40 + turn]  # append the response and an observation
        return prompt

    async def main():
        return await asyncio.gather(*(session(k) for k in range(4)))

    transcripts = asyncio.run(main())
    assert all(len(t) > len(PROMPTS[k % 4]) + 3 for k, t in enumerate(transcripts))
    assert engine.prefilled_tokens < sum(len(t) for t in transcripts)  # later turns reused their KV


def make_router(make_engine, replicas=3) -> RolloutRouter:
    return RolloutRouter([make_engine(build_tiny_qwen2(seed=0), replica_id=i) for i in range(replicas)])


def test_router_spreads_groups_least_loaded_and_keeps_each_group_together(make_engine):
    router = make_router(make_engine)
    requests = [seeded(10 * i + k, PROMPTS[i]) for i in range(3) for k in range(4)]  # 3 groups of 4
    chosen = router.route(requests)
    assert chosen == [0] * 4 + [1] * 4 + [2] * 4  # a group per replica, the least loaded first
    assert router.in_flight == [4, 4, 4]
    router._in_flight = [0, 0, 0]
    results = router.generate(requests)
    assert [r.replica_id for r in results] == chosen
    assert router.in_flight == [0, 0, 0]  # every request completed
    alone = make_engine(build_tiny_qwen2(seed=0)).generate(requests)
    assert [r.response_ids for r in results] == [r.response_ids for r in alone]  # replicas are equal


def test_sessions_stick_to_their_replica_across_turns(make_engine):
    router = make_router(make_engine)
    first = router.generate([seeded(0, PROMPTS[0], session="a"), seeded(1, PROMPTS[1], session="b")])
    assert [r.replica_id for r in first] == [0, 1]
    router._in_flight = [0, 0, 5]  # replica 0 looks least loaded, but the sessions stay
    second = router.generate(
        [
            seeded(2, PROMPTS[1] + list(first[1].response_ids) + [7], session="b"),
            seeded(3, PROMPTS[0] + list(first[0].response_ids) + [7], session="a"),
        ]
    )
    assert [r.replica_id for r in second] == [1, 0]
    assert all(r.num_cached_tokens > 0 for r in second)  # the replica held the session's KV

    async def turn():
        return await router.generate_async(seeded(4, [9, 9], session="b"))

    router._in_flight = [0, 0, 0]
    assert asyncio.run(turn()).replica_id == 1
    assert router.replica_for_session("c") is None


def test_router_syncs_every_replica_and_reports_one_version(make_engine):
    router = make_router(make_engine, replicas=2)
    trained = build_tiny_qwen2(seed=1)
    reports = router.load_weights(trained.state_dict(), version=1, bucket_bytes=2048)
    assert [r.version for r in reports] == [1, 1] and router.weight_version == 1
    greedy = [GenerationRequest("g", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=6))]
    expected = make_engine(trained).generate(greedy)[0].response_ids
    for replica in router.replicas:
        assert replica.generate(greedy)[0].response_ids == expected
    with pytest.raises(ValueError, match="distinct replica ids"):
        RolloutRouter([router.replicas[0], router.replicas[0]])


def test_one_share_runs_in_the_calling_thread_and_the_others_run_concurrently(make_engine):
    """A single in-process replica generates in the caller's thread (OpenMP throttles every team once a
    second thread runs torch kernels: docs/benchmarks.md); with several, all shares are in flight at once."""
    import threading

    router = make_router(make_engine)
    requests = [seeded(10 * i + k, PROMPTS[i]) for i in range(3) for k in range(2)]
    started = threading.Barrier(3, timeout=30)  # each share waits until all three have started
    threads = {}

    def work(replica, part):
        threads[replica.replica_id] = threading.get_ident()
        started.wait()
        return [r.request_id for r in part]

    shares = router.run_shares(requests, work)
    assert [ids for _, ids in shares] == [["r0", "r1"], ["r10", "r11"], ["r20", "r21"]]
    assert threads[2] == threading.get_ident() and len(set(threads.values())) == 3
    assert router.in_flight == [0, 0, 0]

    alone = RolloutRouter([router.replicas[0]])
    caller = []
    alone.run_shares(requests[:2], lambda replica, part: caller.append(threading.get_ident()))
    assert caller == [threading.get_ident()]
    assert alone.run_shares([], work) == []
