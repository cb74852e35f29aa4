"""An agent program trained unchanged through the gateway (docs/agent_gateway.md): two chat calls
with the plain `openai` client — the model answers the question (thinking aloud if it likes), then,
shown its own reply, is asked to check it and answer the question again; the second answer counts.

Train it on the quickstart's arithmetic task (recipes/gateway_agent_arithmetic.yaml):
    stratarl train recipes/gateway_agent_arithmetic.yaml model.path=DIR \
        data.train_files=[train.parquet] data.val_files=[test.parquet]
or any recipe with   agent.gateway.enable=true \
    agent.gateway.agent_function_path=examples/openai_agent/answer_then_check.py
It returns None, so the run's configured reward scores the final answer (the last assistant message).
Each call sends the conversation back as the API returned it and only appends, so the second call's
prompt extends the first call's tokens and the episode trains as one row.
"""

from openai import AsyncOpenAI

CHECK = "Check your reply. "


async def run_episode(base_url: str, api_key: str, row: dict) -> None:
    messages = list(row["messages"])
    question = messages[-1]["content"]
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=48)
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        messages.append({"role": "user", "content": CHECK + question})
        await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    return None
