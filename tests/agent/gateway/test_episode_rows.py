"""Captured calls become training rows without re-tokenizing: one row when every call extends the
previous prompt + response (observations masked), one row per call otherwise; and a model that
samples a non-canonical tokenization is trained on what it sampled, not on the re-tokenized text."""

import asyncio

from openai import AsyncOpenAI

from stratarl.agent.gateway.capture import CallRecord, EpisodeCapture
from stratarl.agent.gateway.episode_rows import episode_trajectories
from stratarl.agent.gateway.server import Gateway
from stratarl.agent.rendering import render_text
from stratarl.rollout.interface import GenerationResult, SamplingParams


def call(prompt, response, version=0):
    return CallRecord(
        tuple(prompt),
        tuple(response),
        tuple(-0.5 for _ in response),
        (version,) * len(response),
        version,
        "stop",
        0,
        "text",
    )


def test_calls_that_extend_each_other_make_one_row_with_observations_masked():
    capture = EpisodeCapture(
        "ep", {"data_source": "d"}, calls=[call([1, 2], [3, 4]), call([1, 2, 3, 4, 9, 9], [5], 1)]
    )
    capture.reward = 0.75
    rows = episode_trajectories(capture, max_response_tokens=16)
    assert rows.merged and rows.split_reason is None and len(rows.trajectories) == 1
    row = rows.trajectories[0]
    assert row.prompt_ids == [1, 2]
    assert row.response_ids == [3, 4, 9, 9, 5]
    assert row.response_mask == [1, 1, 0, 0, 1]  # the tokens the next prompt added are observations
    assert row.response_log_probs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert row.response_versions == [0, 0, -1, -1, 1]
    assert row.reward == 0.75 and row.sample == {"data_source": "d"}


def test_a_rewritten_history_or_an_overlong_merge_gives_one_row_per_call_sharing_the_reward():
    rewritten = EpisodeCapture("ep", {}, calls=[call([1, 2], [3, 4]), call([1, 2, 7, 9], [5])])
    rewritten.reward = 1.0
    rows = episode_trajectories(rewritten, max_response_tokens=16)
    assert not rows.merged and rows.split_reason == "not_a_prefix"
    assert [(t.prompt_ids, t.response_ids, t.reward) for t in rows.trajectories] == [
        ([1, 2], [3, 4], 1.0),
        ([1, 2, 7, 9], [5], 1.0),
    ]
    chained = EpisodeCapture("ep", {}, calls=[call([1], [2, 3]), call([1, 2, 3, 4, 4, 4], [5, 6])])
    over = episode_trajectories(chained, max_response_tokens=6)  # merged span 2 + 3 + 2 = 7 > 6
    assert over.split_reason == "over_budget" and len(over.trajectories) == 2


def test_each_call_is_listed_with_the_row_it_became_and_where_a_prompt_departs():
    rewritten = EpisodeCapture(
        "ep", {"request_id": "u/1"}, calls=[call([1, 2], [3, 4]), call([1, 2, 7, 9], [5], 1)]
    )
    first, second = episode_trajectories(rewritten, max_response_tokens=16).calls
    assert first == {
        "call": 0,
        "prompt_tokens": 2,
        "sampled_tokens": 2,
        "weight_version": 0,
        "finish_reason": "stop",
        "row": "u/1/call0",
        "merged": False,
        "split_reason": "not_a_prefix",
    }
    assert (second["row"], second["weight_version"], second["extends_previous"]) == ("u/1/call1", 1, False)
    # call 0's prompt + response is [1, 2, 3, 4]; call 1's prompt [1, 2, 7, 9] departs at token 2
    assert (second["diverges_at"], second["found_ids"], second["expected_ids"]) == (2, [7, 9], [3, 4])
    chained = EpisodeCapture("ep", {"request_id": "u/0"}, calls=[call([1], [2]), call([1, 2, 5], [6])])
    calls = episode_trajectories(chained, max_response_tokens=16).calls
    assert [(c["row"], c["merged"], c.get("extends_previous")) for c in calls] == [
        ("u/0", True, None),
        ("u/0", True, True),
    ]


class FixedIdsEngine:
    """Answers every request with the same sampled ids: a tokenization the tokenizer would not write."""

    weight_version = 0

    def __init__(self, ids):
        self.ids = ids

    def generate(self, requests):
        return [
            GenerationResult(
                r.request_id,
                r.prompt_ids,
                tuple(self.ids),
                tuple(-0.1 * (j + 1) for j in range(len(self.ids))),
                "stop",
                0,
            )
            for r in requests
        ]


def drifting_episode(renderer, tokenizer, *, keep_sampled_ids):
    """A model that spells `calculator` one character a token; the agent sends its answer back."""
    word = "calculator"
    canonical = tokenizer.encode(word, add_special_tokens=False)
    one_char_each = [tokenizer.convert_tokens_to_ids(c) for c in word]  # the same text, other ids
    assert canonical != one_char_each and tokenizer.decode(one_char_each) == word
    sampled = [*one_char_each, tokenizer.eos_token_id]

    async def agent_twice(gateway):
        base_url, capture = gateway.open_episode({})
        client = AsyncOpenAI(base_url=base_url, api_key=gateway.api_key)
        messages = [{"role": "user", "content": "Name a tool."}]
        reply = await client.chat.completions.create(model="m", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "Again."},
        ]
        await client.chat.completions.create(model="m", messages=messages)
        return capture, messages

    async def main():
        sampling = SamplingParams(max_tokens=32)
        async with Gateway(
            FixedIdsEngine(sampled),
            renderer,
            sampling=sampling,
            max_prompt_tokens=256,
            keep_sampled_ids=keep_sampled_ids,
        ) as gateway:
            return await agent_twice(gateway)

    capture, messages = asyncio.run(main())
    return capture, messages, sampled


def test_re_tokenizing_the_chat_would_drift_and_the_captured_ids_are_what_is_trained(renderer, tokenizer):
    capture, messages, sampled = drifting_episode(renderer, tokenizer, keep_sampled_ids=False)
    first, second = capture.calls
    assert first.response_ids == tuple(sampled) and first.text == "calculator"
    # what a trainer re-tokenizing the chat would train on: the canonical ids, which were never sampled
    retokenized = renderer.prompt_ids(messages)
    assert retokenized[: len(first.sequence)] != list(first.sequence)
    assert second.prompt_ids == tuple(renderer.prompt_ids(messages))  # the gateway's second prompt
    rows = episode_trajectories(capture, max_response_tokens=64)
    assert rows.split_reason == "not_a_prefix"  # so the calls are trained one row each ...
    assert rows.trajectories[0].response_ids == sampled  # ... on the ids sampled, with their log-probs
    assert rows.trajectories[0].response_log_probs == list(first.log_probs)
    assert capture.prompts_kept_sampled_ids == 0


def test_a_prompt_that_sends_the_answer_back_keeps_its_sampled_ids_and_the_episode_is_one_row(
    renderer, tokenizer
):
    capture, messages, sampled = drifting_episode(renderer, tokenizer, keep_sampled_ids=True)
    first, second = capture.calls
    text = render_text(tokenizer, messages, add_generation_prompt=True)
    # the second prompt: the first call's prompt + sampled ids, then the rest of the chat tokenized ...
    assert second.prompt_ids[: len(first.sequence)] == first.sequence
    rest = text[len(tokenizer.decode(list(first.sequence), skip_special_tokens=False)) :]
    assert list(second.prompt_ids[len(first.sequence) :]) == tokenizer.encode(rest, add_special_tokens=False)
    # ... the same characters as the template's text, token for token what the model read and wrote
    assert tokenizer.decode(list(second.prompt_ids), skip_special_tokens=False) == text
    assert second.prompt_ids != tuple(renderer.prompt_ids(messages)) and capture.prompts_kept_sampled_ids == 1
    rows = episode_trajectories(capture, max_response_tokens=64)
    assert rows.merged and len(rows.trajectories) == 1
    row = rows.trajectories[0]
    assert row.prompt_ids == list(first.prompt_ids)
    assert row.response_ids[: len(sampled)] == sampled and row.response_ids[-len(sampled) :] == sampled
    n_obs = len(row.response_ids) - 2 * len(sampled)  # the user turn between the two answers
    assert row.response_mask == [1] * len(sampled) + [0] * n_obs + [1] * len(sampled)
