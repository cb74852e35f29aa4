"""The torch engine's scheduling: continuous batching (bounded rows, joins while others run, finished rows
cost nothing), the prefill token budget, prefix sharing of the n samples and of a session's turns
(same results as without sharing), stop strings, the context cap, and bf16 rollout weights."""

import copy

import pytest
import torch

from stratarl.algo.rollout_correction import offpolicy_metrics
from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest, SamplingParams
from tests.rollout.test_torch_engine import PROMPTS, teacher_forced_log_probs
from tests.rollout.tiny_lm import PAD

LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.,"


def decode(ids):  # one character per token of the 64-token vocabulary
    return "".join(LETTERS[t] for t in ids)


def group_requests(n: int, max_tokens=(9, 4, 12, 7)) -> list[GenerationRequest]:
    """n seeded samples of each prompt, the samples of a prompt adjacent (as the trainer repeats them)."""
    return [
        GenerationRequest(
            f"p{i}/{k}", p, SamplingParams(temperature=0.8, max_tokens=max_tokens[i], seed=10 * i + k)
        )
        for i, p in enumerate(PROMPTS)
        for k in range(n)
    ]


def step_by_step(engine, requests) -> tuple[list[int], list]:
    """Drive the engine one step at a time: (running rows after each step, results)."""
    futures = engine.submit(requests)
    rows = []
    while not all(f.done() for f in futures):
        engine._run_step()
        rows.append(len(engine._core.rows))
    return rows, [f.result() for f in futures]


def test_rows_are_bounded_new_requests_join_and_results_do_not_depend_on_it(tiny_model, make_engine):
    lengths = [9, 4, 12, 7, 5, 10, 3, 8, 6, 11, 2, 9]
    requests = [
        GenerationRequest(f"r{i}", PROMPTS[i % 4], SamplingParams(temperature=0.8, max_tokens=m, seed=i))
        for i, m in enumerate(lengths)
    ]
    wide = make_engine(tiny_model).generate(requests)
    running, joined = step_by_step(make_engine(tiny_model, max_num_seqs=3), requests)
    assert max(running) == 3
    # a finished row's place is taken at the next step: fewer steps than 4 waves of 3 one after another
    waves = sum(max(lengths[w : w + 3]) for w in range(0, 12, 3))  # 12 + 10 + 11 + 11 = 44
    assert len(running) < waves
    for a, b in zip(joined, wide, strict=True):
        assert a.response_ids == b.response_ids
        assert a.log_probs == pytest.approx(b.log_probs, abs=5e-5)  # batch shapes differ (see below)
    batch = results_to_batch(joined, pad_token_id=PAD)
    recomputed = teacher_forced_log_probs(tiny_model, batch, temperature=0.8)
    torch.testing.assert_close(batch["rollout_log_probs"], recomputed, atol=1e-5, rtol=0)


def test_finished_rows_stop_costing_compute(make_engine):
    from tests.rollout.tiny_lm import build_tiny_qwen2

    model = build_tiny_qwen2(seed=0)
    fed: list[tuple[int, int]] = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(tuple(args[0].shape)))
    results = make_engine(model).generate(group_requests(n=2))
    decode_rows = sum(rows for rows, length in fed if length == 1)
    # each response token but the last is fed back exactly once; no finished row is ever fed
    assert decode_rows == sum(len(r.response_ids) - 1 for r in results)


def test_prefix_sharing_prefills_each_prompt_once_and_changes_no_result(tiny_model, make_engine):
    requests = group_requests(n=4)
    shared_engine = make_engine(tiny_model)
    shared = shared_engine.generate(requests)
    assert shared_engine.prefilled_tokens == sum(len(p) for p in PROMPTS)  # not 4x that
    assert [r.num_cached_tokens for r in shared[:4]] == [0] + [len(PROMPTS[0])] * 3
    for request, result in zip(requests, shared, strict=True):  # each alone, no cache at all
        alone = make_engine(tiny_model, prefix_cache_tokens=0).generate([request])[0]
        assert result.response_ids == alone.response_ids
        # batch shape changes fp32 rounding: logits of magnitude ~10 (wide init) differ by ~1e-5
        assert result.log_probs == pytest.approx(alone.log_probs, abs=5e-5)
    # a later call with the same prompt is served from the prompt cache: no prefill at all
    again = shared_engine.generate(requests[:1])[0]
    assert shared_engine.prefilled_tokens == sum(len(p) for p in PROMPTS)
    assert again.response_ids == shared[0].response_ids and again.num_cached_tokens == len(PROMPTS[0])


def test_prefill_budget_limits_prompt_tokens_per_step(tiny_model, make_engine):
    engine = make_engine(tiny_model, max_prefill_tokens=8)
    requests = [
        GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=3))
        for i, p in enumerate(PROMPTS)
    ]
    futures = engine.submit(requests)
    per_step = []
    while not all(f.done() for f in futures):
        before = engine.prefilled_tokens
        engine._run_step()
        per_step.append(engine.prefilled_tokens - before)
    # prompts of 3, 7, 1, 5 tokens in FIFO order under a budget of 8: step 1 admits the 3 (3 + 7 > 8),
    # step 2 the 7 and the 1 (= 8), step 3 the 5
    assert per_step[:3] == [3, 8, 5]
    expected = make_engine(tiny_model).generate(requests)
    assert [f.result().response_ids for f in futures] == [r.response_ids for r in expected]


def test_session_turns_reuse_their_kv_and_match_a_full_prefill(tiny_model, make_engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    cached, plain = make_engine(tiny_model), make_engine(tiny_model, prefix_cache_tokens=0)
    turn1 = cached.generate([GenerationRequest("t1", PROMPTS[1], greedy, session_id="s")])[0]
    prompt2 = PROMPTS[1] + list(turn1.response_ids) + [40, 41]  # the observation of a tool, say
    before = cached.prefilled_tokens
    turn2 = cached.generate([GenerationRequest("t2", prompt2, greedy, session_id="s")])[0]
    reused = len(PROMPTS[1]) + len(turn1.response_ids) - 1  # the last response token was never fed
    assert turn2.num_cached_tokens == reused
    assert cached.prefilled_tokens - before == len(prompt2) - reused
    reference = plain.generate([GenerationRequest("t2", prompt2, greedy)])[0]
    assert turn2.response_ids == reference.response_ids
    assert turn2.log_probs == pytest.approx(reference.log_probs, abs=1e-5)


def test_stop_strings_end_at_the_token_that_completes_them(tiny_model, make_engine):
    engine = make_engine(tiny_model, eos_token_ids=PAD, detokenize=decode)
    free = engine.generate(
        [GenerationRequest("f", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12))]
    )[0]
    stop = decode(free.response_ids[3:5])
    # plain loop: the first k whose decoded prefix contains the stop string
    k = next(k for k in range(1, 13) if stop in decode(free.response_ids[:k]))
    result = engine.generate(
        [GenerationRequest("s", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12, stop=stop))]
    )[0]
    assert result.response_ids == free.response_ids[:k]
    assert (result.finish_reason, result.stop_reason) == ("stop", stop)
    with pytest.raises(ValueError, match="need a detokenizer"):
        make_engine(tiny_model).generate([GenerationRequest("x", [5], SamplingParams(stop="a"))])


def test_context_length_caps_the_response_and_rejects_a_prompt_that_fills_it(tiny_model, make_engine):
    engine = make_engine(tiny_model, eos_token_ids=PAD)  # max_position_embeddings = 128
    long_prompt = [5] * 120
    result = engine.generate(
        [GenerationRequest("l", long_prompt, SamplingParams(temperature=0.0, max_tokens=20))]
    )[0]
    assert len(result.response_ids) == 8 and result.finish_reason == "length"
    with pytest.raises(ValueError, match="does not fit the model's context of 128"):
        engine.generate([GenerationRequest("x", [5] * 128, SamplingParams())])


def test_bf16_rollout_weights_leave_a_log_prob_mismatch_that_rollout_correction_sees(tiny_model, make_engine):
    served = make_engine(copy.deepcopy(tiny_model), dtype=torch.bfloat16)
    assert next(served.model.parameters()).dtype == torch.bfloat16
    results = served.generate(group_requests(n=2))
    batch = results_to_batch(results, pad_token_id=PAD)
    fp32 = teacher_forced_log_probs(tiny_model, batch, temperature=0.8)  # the trainer's view, fp32
    mask = batch["response_mask"].bool()
    gap = (batch["rollout_log_probs"] - fp32)[mask].abs()
    assert 1e-4 < gap.max() < 0.5  # visible, yet the same policy up to rounding
    metrics = offpolicy_metrics(fp32, batch["rollout_log_probs"], batch["response_mask"])
    assert metrics["k3_kl"] > 0 and metrics["log_ppl_abs_diff"] > 0
