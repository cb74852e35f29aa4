"""Partial rollout in the torch engine: a weight load while long responses are running. With
`continue` the tokens sampled before the load carry the old version and those after it the new one,
and every token's log-prob is its version's, given its whole prefix (the running rows' KV was
recomputed); with `finish` the load waits and every token has the old version. A session's KV kept
after the load, and a cached prompt, are never the old weights'."""

import dataclasses
import threading
import time

import pytest
import torch

from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams
from tests.rollout.tiny_lm import build_tiny_qwen2

LONG = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
PROMPTS = [[5, 9, 14], [7, 21, 8, 30, 11], [5, 9, 14], [40, 2, 17, 33]]


def requests(prefix="r"):
    return [
        GenerationRequest(f"{prefix}{i}", p, dataclasses.replace(LONG, seed=100 + i))
        for i, p in enumerate(PROMPTS)
    ]


def log_probs_under(model, prompt, response) -> torch.Tensor:
    """[T] log π(response_t | prompt, response_<t) by one fresh forward (temperature 1)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


def check_each_token_by_its_version(result: GenerationResult, models: dict) -> None:
    """Each token's recorded log-prob is its own version's given its prefix (float32 decode vs one
    full forward: within 1e-5 + 1e-5·|log p|), and, where another version is given, not that one's."""
    recorded = torch.tensor(result.log_probs)
    versions = torch.tensor(result.token_versions)
    fresh = {v: log_probs_under(model, result.prompt_ids, result.response_ids) for v, model in models.items()}
    for version in models:
        mine = versions == version
        if mine.any():
            torch.testing.assert_close(recorded[mine], fresh[version][mine], atol=1e-5, rtol=1e-5)
            for other in set(models) - {version}:  # the models differ far beyond the tolerance
                assert (recorded[mine] - fresh[other][mine]).abs().max() > 1e-2


def step_until(engine, tokens: int) -> None:
    """Step the engine in this thread until every running row has `tokens` tokens."""
    while not engine._core.rows or min(len(r.tokens) for r in engine._core.rows) < tokens:
        with engine._step_lock:
            engine._run_step()


def test_continue_switches_running_rows_to_the_new_weights_at_a_step_boundary(make_engine):
    old, new = build_tiny_qwen2(seed=0), build_tiny_qwen2(seed=1)
    engine = make_engine(build_tiny_qwen2(seed=0), partial_rollout="continue")
    futures = engine.submit(requests())
    step_until(engine, 7)
    switch = [len(r.tokens) for r in engine._core.rows]
    engine.load_weights(new.state_dict(), version=1)
    results = [f.result(timeout=60) for f in futures]  # the engine's driver thread steps on
    for result, at in zip(results, switch, strict=True):
        assert len(result.response_ids) == LONG.max_tokens
        assert result.token_versions == (0,) * at + (1,) * (LONG.max_tokens - at)
        assert result.weight_version == 0  # the oldest version in the response
        check_each_token_by_its_version(result, {0: old, 1: new})
    # the tokens after the switch differ from what the old weights would have sampled with the same
    # seeds: the new weights really drove them
    unswitched = make_engine(build_tiny_qwen2(seed=0)).generate(requests())
    assert [r.response_ids[:7] for r in results] == [r.response_ids[:7] for r in unswitched]
    assert [r.response_ids for r in results] != [r.response_ids for r in unswitched]


def test_finish_lets_running_rows_end_on_the_old_weights(make_engine):
    old = build_tiny_qwen2(seed=0)
    engine = make_engine(build_tiny_qwen2(seed=0))  # partial_rollout=finish, the default
    futures = engine.submit(requests())
    step_until(engine, 7)
    engine.load_weights(build_tiny_qwen2(seed=1).state_dict(), version=1)  # waits for the rows
    for result in (f.result(timeout=1) for f in futures):
        assert set(result.token_versions) == {0} and len(result.token_versions) == LONG.max_tokens
        check_each_token_by_its_version(result, {0: old})
    assert {r.weight_version for r in engine.generate(requests("after"))} == {1}


@pytest.mark.parametrize("partial_rollout", ["finish", "continue"])
def test_a_push_from_another_thread_while_generate_runs(make_engine, partial_rollout):
    """The trainer's thread pushes while the producer's thread is inside `generate` (the async
    trainer in one process; a Ray replica's concurrent calls are the same two threads)."""
    old, new = build_tiny_qwen2(seed=0), build_tiny_qwen2(seed=1)
    engine = make_engine(build_tiny_qwen2(seed=0), partial_rollout=partial_rollout)
    out: dict = {}
    producer = threading.Thread(target=lambda: out.setdefault("r", engine.generate(requests())))
    producer.start()
    deadline = time.monotonic() + 30
    while not any(len(r.tokens) >= 3 for r in list(engine._core.rows)) and time.monotonic() < deadline:
        time.sleep(0.0005)
    engine.load_weights(new.state_dict(), version=1)
    producer.join(timeout=60)
    results = out["r"]
    for result in results:
        versions = result.token_versions
        assert list(versions) == sorted(versions) and set(versions) <= {0, 1}
        check_each_token_by_its_version(result, {0: old, 1: new})
    mixed = [r for r in results if len(set(r.token_versions)) == 2]
    if partial_rollout == "finish":
        assert not mixed
    else:
        assert mixed, [r.token_versions for r in results]  # it arrived mid-flight


def test_no_cached_prefix_outlives_a_weight_load(make_engine):
    """A cached prompt is prefilled again after a load, and a session that ran across a `continue`
    load keeps the new weights' KV: its next turn's log-probs are the new model's."""
    new = build_tiny_qwen2(seed=1)
    engine = make_engine(build_tiny_qwen2(seed=0), partial_rollout="continue")
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=3)
    turn = GenerationRequest("t1", [5, 9, 14, 20], sampled, session_id="s")
    (future,) = engine.submit([turn])
    step_until(engine, 4)
    engine.load_weights(new.state_dict(), version=1)
    first = future.result(timeout=60)
    assert first.token_versions == (0,) * 4 + (1,) * 8
    second_prompt = list(first.prompt_ids) + list(first.response_ids) + [7, 8]
    before = engine.prefilled_tokens
    (second,) = engine.generate([GenerationRequest("t2", second_prompt, sampled, session_id="s")])
    assert engine.prefilled_tokens - before == 3  # the session's KV was used: only the new tokens
    assert set(second.token_versions) == {1}
    check_each_token_by_its_version(second, {1: new})
    # a prompt cached under version 1 is prefilled again once version 2 arrives
    prompt = [30, 31, 32, 33, 34]
    engine.generate([GenerationRequest("p1", prompt, sampled)])
    before = engine.prefilled_tokens
    engine.generate([GenerationRequest("p2", prompt, sampled)])
    assert engine.prefilled_tokens == before  # a hit under the same weights
    newer = build_tiny_qwen2(seed=2)
    engine.load_weights(newer.state_dict(), version=2)
    (third,) = engine.generate([GenerationRequest("p3", prompt, sampled)])
    assert engine.prefilled_tokens - before == len(prompt)
    check_each_token_by_its_version(third, {2: newer})


def test_unknown_partial_rollout_is_refused(make_engine):
    with pytest.raises(ValueError, match="partial_rollout='resume'; valid: finish, continue"):
        make_engine(build_tiny_qwen2(seed=0), partial_rollout="resume")
