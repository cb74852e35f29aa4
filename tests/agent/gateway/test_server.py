"""The gateway through the real OpenAI client and plain HTTP: chat and completions on a real tiny
engine with every call captured, function calling both ways, OpenAI-style errors and 401, 64
concurrent episodes batched into shared engine calls, a timed-out episode cancelled and counted."""

import asyncio
import json

import pytest
from openai import AsyncOpenAI, AuthenticationError, BadRequestError, NotFoundError

from stratarl.agent.gateway.episode_rows import episode_trajectories, rows_metrics
from stratarl.agent.gateway.episodes import InProcessAgent, run_episodes
from stratarl.agent.gateway.server import Gateway
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from tests.agent.scripted_engine import ScriptedEngine
from tests.agent.test_runner_torch import tiny_lm

QUESTION = [{"role": "user", "content": "What is 6*7?"}]
CALCULATOR = {
    "type": "function",
    "function": {"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {}}}},
}


@pytest.fixture(scope="module")
def engine(tokenizer):
    return TorchRolloutEngine(
        tiny_lm(len(tokenizer)),
        eos_token_ids=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seed=0,
    )


def serve(engine, renderer, **kwargs) -> Gateway:
    defaults = {"sampling": SamplingParams(max_tokens=8), "max_prompt_tokens": 256, "seed": 3,
                "keep_sampled_ids": False}  # fmt: skip
    return Gateway(engine, renderer, **(defaults | kwargs))


def test_chat_returns_the_sampled_text_and_log_probs_and_captures_the_exact_ids(engine, renderer, tokenizer):
    async def main():
        async with serve(engine, renderer) as gateway:
            base_url, capture = gateway.open_episode({})
            client = AsyncOpenAI(base_url=base_url, api_key=gateway.api_key)
            reply = await client.chat.completions.create(
                model="anything", messages=QUESTION, logprobs=True, n=2, max_tokens=5
            )
            return reply, capture

    reply, capture = asyncio.run(main())
    assert len(reply.choices) == 2 and len(capture.calls) == 2
    for choice, call in zip(reply.choices, capture.calls, strict=True):
        assert call.prompt_ids == tuple(renderer.prompt_ids(QUESTION))  # what the engine saw
        assert 1 <= len(call.response_ids) <= 5  # max_tokens honoured
        assert choice.message.content == renderer.assistant_text(call.response_ids)
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(list(call.log_probs))
        assert all(lp < 0 for lp in call.log_probs)
    assert reply.usage.prompt_tokens == len(renderer.prompt_ids(QUESTION))
    assert reply.usage.completion_tokens == sum(len(c.response_ids) for c in capture.calls)


def test_completions_take_text_or_token_ids_and_models_lists_the_policy(engine, renderer, tokenizer):
    async def main():
        async with serve(engine, renderer) as gateway:
            base_url, capture = gateway.open_episode({})
            client = AsyncOpenAI(base_url=base_url, api_key=gateway.api_key)
            models = await client.models.list()
            text = await client.completions.create(model="m", prompt="2+2=", max_tokens=3, logprobs=1)
            ids = await client.completions.create(model="m", prompt=[5, 6, 7], max_tokens=3)
            return models, text, ids, capture

    models, text, ids, capture = asyncio.run(main())
    assert [m.id for m in models.data] == ["stratarl-policy"]
    assert capture.calls[0].prompt_ids == tuple(tokenizer.encode("2+2=", add_special_tokens=False))
    assert capture.calls[1].prompt_ids == (5, 6, 7)  # token ids are used as they are
    assert text.choices[0].logprobs.token_logprobs == pytest.approx(list(capture.calls[0].log_probs))
    assert ids.choices[0].text == renderer.assistant_text(capture.calls[1].response_ids)


def test_tool_calls_map_to_openai_function_calls_and_back_into_the_prompt(renderer, tokenizer):
    call_text = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, {"ep0": [call_text, "The answer is 42."]})

    async def main():
        async with serve(engine, renderer, sampling=SamplingParams(max_tokens=64)) as gateway:
            base_url, capture = gateway.open_episode({})
            client = AsyncOpenAI(base_url=base_url, api_key=gateway.api_key)
            first = await client.chat.completions.create(model="m", messages=QUESTION, tools=[CALCULATOR])
            message = first.choices[0].message
            history = [
                *QUESTION,
                message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"},
            ]
            second = await client.chat.completions.create(model="m", messages=history, tools=[CALCULATOR])
            return first, second, capture

    first, second, capture = asyncio.run(main())
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "calculator"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"expression": "6*7"}
    assert (
        second.choices[0].message.content == "The answer is 42."
        and second.choices[0].message.tool_calls is None
    )
    # the call was written back as the model wrote it: the second prompt extends the first call's ids
    rows = episode_trajectories(capture, max_response_tokens=256)
    assert rows.merged and len(rows.trajectories) == 1
    row = rows.trajectories[0]
    observation = tokenizer.decode(
        [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if not m]
    )
    assert "<|im_start|>tool\n42<|im_end|>" in observation


async def _post(port: int, raw: bytes) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")).split(":")[1]
    )
    body = json.loads(await reader.readexactly(length))
    writer.close()
    return int(head.split(b" ")[1]), body


def _request(path: str, body: bytes, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_bad_requests_get_openai_errors_never_a_dropped_connection(engine, renderer):
    async def main():
        async with serve(engine, renderer) as gateway:
            base_url, _ = gateway.open_episode({})
            path, key, port = base_url.split(str(gateway.http.port))[1], gateway.api_key, gateway.http.port
            chat = f"{path}/chat/completions"
            good = json.dumps({"messages": QUESTION}).encode()
            cases = {
                "no key": _request(chat, good, None),
                "not json": _request(chat, b"{oops", key),
                "temperature": _request(
                    chat, json.dumps({"messages": QUESTION, "temperature": 9}).encode(), key
                ),
                "stream": _request(chat, json.dumps({"messages": QUESTION, "stream": True}).encode(), key),
                "no messages": _request(chat, b"{}", key),
                "forced tool": _request(
                    chat,
                    json.dumps(
                        {"messages": QUESTION, "tools": [CALCULATOR], "tool_choice": "required"}
                    ).encode(),
                    key,
                ),
                "unknown episode": _request("/e/nope/v1/chat/completions", good, key),
                "no episode": _request("/v1/chat/completions", good, key),
                "garbage": b"HELLO\r\n\r\n",
            }
            return {name: await _post(port, raw) for name, raw in cases.items()}

    answers = asyncio.run(main())
    expected = {
        "no key": (401, None),
        "not json": (400, None),
        "temperature": (400, "temperature"),
        "stream": (400, "stream"),
        "no messages": (400, "messages"),
        "forced tool": (400, "tool_choice"),
        "unknown episode": (404, None),
        "no episode": (404, None),
        "garbage": (400, None),
    }
    for name, (status, param) in expected.items():
        got_status, body = answers[name]
        assert got_status == status, (name, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], name
        assert body["error"]["param"] == param, (name, body)
    assert "stream=true is not supported" in answers["stream"][1]["error"]["message"]


def test_the_openai_client_sees_401_and_400_as_its_own_errors(engine, renderer):
    async def main():
        async with serve(engine, renderer) as gateway:
            base_url, _ = gateway.open_episode({})
            with pytest.raises(AuthenticationError):
                await AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
            client = AsyncOpenAI(base_url=base_url, api_key=gateway.api_key, max_retries=0)
            with pytest.raises(BadRequestError, match="stream=true is not supported"):
                await client.chat.completions.create(model="m", messages=QUESTION, stream=True)

    asyncio.run(main())


async def _two_turn_agent(base_url, api_key, row):
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "again"},
        ]
    return float(len(reply.choices[0].message.content))


def test_64_concurrent_episodes_share_engine_batches(engine, renderer):
    rows = [{"question": f"What is {i}+{i}?"} for i in range(64)]

    async def main():
        async with serve(engine, renderer) as gateway:
            agent = InProcessAgent(_two_turn_agent, timeout_s=120)
            captures = await run_episodes(gateway, agent, rows, max_concurrent=64)
            return captures, gateway.batcher.batch_sizes

    captures, batch_sizes = asyncio.run(main())
    assert [c.status for c in captures] == ["done"] * 64
    assert all(len(c.calls) == 2 and c.reward == float(len(c.calls[-1].text)) for c in captures)
    assert sum(batch_sizes) == 128
    assert len(batch_sizes) < 128 and max(batch_sizes) > 1  # requests in flight were generated together


def test_an_episode_past_its_deadline_is_cancelled_and_counted(engine, renderer):
    late_calls = []

    async def slow_agent(base_url, api_key, row):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            await client.chat.completions.create(model="m", messages=QUESTION)
            if row["slow"]:
                await asyncio.sleep(60)
        finally:  # also when the deadline falls inside the call (a loaded machine)
            if row["slow"]:
                late_calls.append(base_url)
        return 1.0

    async def main():
        async with serve(engine, renderer) as gateway:
            rows = [{"slow": False}, {"slow": True}]
            # a deadline far above one call of the tiny engine (ms), far below the slow episode's 60 s
            agent = InProcessAgent(slow_agent, timeout_s=5.0)
            captures = await run_episodes(gateway, agent, rows, max_concurrent=8)
            client = AsyncOpenAI(base_url=late_calls[0], api_key=gateway.api_key, max_retries=0)
            with pytest.raises(NotFoundError, match="has ended"):  # a cancelled episode takes no more calls
                await client.chat.completions.create(model="m", messages=QUESTION)
            return captures

    captures = asyncio.run(main())
    assert [c.status for c in captures] == ["done", "timeout"]
    assert len(late_calls) == 1  # the coroutine was really cancelled (its finally ran)
    results = [episode_trajectories(c, max_response_tokens=64) for c in captures if c.status == "done"]
    metrics = rows_metrics(results, captures)
    assert metrics["agent/gateway_episode_timeouts"] == 1.0 and metrics["agent/gateway_rows"] == 1.0
