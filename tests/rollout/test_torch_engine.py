"""The torch backend: log-probs equal a teacher-forced fp32 recompute, greedy equals HF `generate`, seeds,
stop/length finish reasons, padding and finished-row invariance, top_k=1 = greedy, bounded batches."""

import pytest
import torch

from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationRequest, RolloutEngine, SamplingParams
from tests.rollout.tiny_lm import PAD, build_tiny_qwen2

PROMPTS = [[5, 9, 14], [7, 21, 8, 30, 11, 4, 17], [40], [12, 12, 33, 6, 50]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def requests(prompts, sampling: SamplingParams | list[SamplingParams]) -> list[GenerationRequest]:
    params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    return [GenerationRequest(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params, strict=True))]


def teacher_forced_log_probs(model, batch: dict, temperature: float) -> torch.Tensor:
    """What the trainer computes: one forward on prompt+response, logits / τ, log_softmax, gather."""
    P = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits  # [N, P+T, V]
    logits = logits[:, P - 1 : -1] / temperature  # position P-1+t predicts response token t
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, batch["responses"][..., None]).squeeze(-1) * batch["response_mask"]


def first_fresh_token(tokens: list[int], start: int) -> int:
    """A token of `tokens` at index >= start that does not occur earlier (usable as a stop id)."""
    return next(t for i, t in enumerate(tokens) if i >= start and t not in tokens[:i])


def test_engine_satisfies_the_protocol(tiny_model, make_engine):
    assert isinstance(make_engine(tiny_model), RolloutEngine)


def test_log_probs_equal_teacher_forced_recompute(tiny_model, make_engine):
    engine = make_engine(tiny_model)
    # varied lengths: different max_tokens, and a stop id that ends some rows early
    params = [SamplingParams(temperature=0.7, max_tokens=m, seed=i) for i, m in enumerate([9, 4, 12, 7])]
    params[2] = SamplingParams(temperature=0.7, max_tokens=12, seed=2, stop_token_ids=(53,))
    results = engine.generate(requests(PROMPTS, params))
    batch = results_to_batch(results, pad_token_id=PAD)
    recomputed = teacher_forced_log_probs(tiny_model, batch, temperature=0.7)
    assert len({len(r.response_ids) for r in results}) > 1
    assert {r.finish_reason for r in results} == {"stop", "length"}
    torch.testing.assert_close(batch["rollout_log_probs"], recomputed, atol=1e-5, rtol=0)


def test_greedy_equals_hf_generate_token_for_token(tiny_model, make_engine):
    ids = torch.full((len(PROMPTS), 7), PAD)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, 7 - len(p) :], mask[i, 7 - len(p) :] = torch.tensor(p), 1

    def hf_greedy(eos: int) -> list[list[int]]:
        out = tiny_model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=eos,
            pad_token_id=PAD,
        )[:, 7:].tolist()
        return [row[: row.index(eos) + 1] if eos in row else row for row in out]

    # first pick an EOS that row 0 emits at its 4th step or later, so that rows stop at different times
    eos = first_fresh_token(hf_greedy(eos=PAD)[0], start=3)
    expected = hf_greedy(eos)
    results = make_engine(tiny_model, eos_token_ids=eos).generate(requests(PROMPTS, GREEDY))
    assert [list(r.response_ids) for r in results] == expected
    assert results[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_seeds_differ(tiny_model, make_engine):
    def sample(seed):
        sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=seed)
        return [r.response_ids for r in make_engine(tiny_model).generate(requests(PROMPTS, sampling))]

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_a_seeded_request_does_not_depend_on_its_batch(tiny_model, make_engine):
    engine = make_engine(tiny_model)
    sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=3)
    alone = engine.generate([GenerationRequest("a", PROMPTS[0], sampling)])[0]
    others = SamplingParams(temperature=1.0, max_tokens=5)
    batch = [*requests(PROMPTS[1:], others), GenerationRequest("a", PROMPTS[0], sampling)]
    mixed = engine.generate(batch)[-1]
    assert mixed.response_ids == alone.response_ids
    assert mixed.log_probs == pytest.approx(alone.log_probs, abs=1e-5)


def test_engine_seed_makes_unseeded_requests_reproducible(tiny_model, make_engine):
    sampling = SamplingParams(temperature=1.0, max_tokens=12)
    first = make_engine(tiny_model, seed=5)
    again = make_engine(tiny_model, seed=5)
    one, two = first.generate(requests(PROMPTS, sampling)), again.generate(requests(PROMPTS, sampling))
    assert [r.response_ids for r in one] == [r.response_ids for r in two]
    later = first.generate(requests(PROMPTS, sampling))  # the shared generator moved on
    assert [r.response_ids for r in later] != [r.response_ids for r in one]


def test_eos_stops_with_reason_stop_and_max_tokens_with_reason_length(tiny_model, make_engine):
    free = make_engine(tiny_model, eos_token_ids=PAD).generate(requests(PROMPTS[:1], GREEDY))[0]
    eos = first_fresh_token(list(free.response_ids), start=2)
    stop_at = free.response_ids.index(eos)
    results = make_engine(tiny_model, eos_token_ids=eos).generate(requests(PROMPTS[:1] * 2, GREEDY))
    stopped = results[0]
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == free.response_ids[: stop_at + 1]  # the EOS is kept as last token
    assert len(stopped.log_probs) == stop_at + 1
    short = make_engine(tiny_model, eos_token_ids=eos).generate(
        requests(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=stop_at))
    )[0]
    assert short.finish_reason == "length" and len(short.response_ids) == stop_at


def test_request_stop_ids_stop_only_their_request_and_finished_rows_leave_cleanly(tiny_model, make_engine):
    engine = make_engine(tiny_model, eos_token_ids=PAD)
    free = engine.generate(requests(PROMPTS, GREEDY))
    stop = first_fresh_token(list(free[1].response_ids), start=1)
    params = [GREEDY] * 4
    params[1] = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=(stop,))
    results = engine.generate(requests(PROMPTS, params))
    assert results[1].finish_reason == "stop" and results[1].response_ids[-1] == stop
    assert len(results[1].response_ids) < 8
    # the other rows go on after row 1 left the batch (and its KV cache), exactly as before
    for i in (0, 2, 3):
        if stop not in free[i].response_ids:
            assert results[i].response_ids == free[i].response_ids
            assert results[i].log_probs == pytest.approx(free[i].log_probs, abs=1e-5)


def test_left_padding_does_not_change_a_prompts_output(tiny_model, make_engine):
    engine = make_engine(tiny_model)
    short, long = PROMPTS[0], PROMPTS[1]
    alone = engine.generate(requests([short], GREEDY))[0]
    padded = engine.generate(requests([long, short], GREEDY))[1]
    assert padded.response_ids == alone.response_ids
    assert padded.log_probs == pytest.approx(alone.log_probs, abs=1e-5)


def test_top_k_one_equals_greedy(tiny_model, make_engine):
    engine = make_engine(tiny_model)
    greedy = engine.generate(requests(PROMPTS, GREEDY))
    top1 = engine.generate(requests(PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_tokens=8)))
    assert [r.response_ids for r in top1] == [r.response_ids for r in greedy]
    # τ = 1 on both, so the full-vocabulary log-probs agree as well
    assert [r.log_probs for r in top1] == [r.log_probs for r in greedy]


def test_chunking_and_ids_keep_request_order(tiny_model, make_engine):
    many = requests(PROMPTS * 3, GREEDY)
    whole = make_engine(tiny_model).generate(many)
    chunked = make_engine(tiny_model, max_num_seqs=5).generate(many)
    assert [r.request_id for r in chunked] == [r.request_id for r in many]
    assert [r.response_ids for r in chunked] == [r.response_ids for r in whole]
    assert [r.prompt_ids for r in whole] == [tuple(p) for p in PROMPTS * 3]
    assert make_engine(tiny_model).generate([]) == []


def test_generate_restores_the_models_train_mode(make_engine):
    model = build_tiny_qwen2(seed=0).train()
    make_engine(model).generate(requests(PROMPTS[:1], GREEDY))
    assert model.training


def test_a_module_in_train_mode_is_switched_once_per_generate_not_per_step(make_engine, monkeypatch):
    """The actor's own model (rollout.weight_sharing) arrives in training mode: `eval()` walks every
    module, so it is switched for the whole call and back after, and back at once when a step raises."""
    model = build_tiny_qwen2(seed=0).train()
    switches = []
    original = model.train
    monkeypatch.setattr(model, "train", lambda mode=True: switches.append(mode) or original(mode))
    engine = make_engine(model)
    [result] = engine.generate(
        requests(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    )
    assert len(result.response_ids) == 6  # six steps
    assert switches == [False, True] and model.training  # eval() is train(False)

    def broken(*args, **kwargs):
        raise RuntimeError("a step fails")

    monkeypatch.setattr(engine._core, "step", broken)
    with pytest.raises(RuntimeError, match="a step fails"):
        engine.generate(requests(PROMPTS[:1], GREEDY))
    assert model.training
