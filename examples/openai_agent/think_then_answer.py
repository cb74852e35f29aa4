"""An agent program trained unchanged through the gateway (docs/agent_gateway.md): two chat calls
with the plain `openai` client — first the model thinks about the problem, then, shown its own
thoughts, it gives the final answer.

Train it on the quickstart's arithmetic task (recipes/gateway_agent_arithmetic.yaml):
    stratarl train recipes/gateway_agent_arithmetic.yaml model.path=DIR \
        data.train_files=[train.parquet] data.val_files=[test.parquet]
or any recipe with   agent.gateway.enable=true \
    agent.gateway.agent_function_path=examples/openai_agent/think_then_answer.py
It returns None, so the run's configured reward scores the final answer (the last assistant message).
Each call sends the conversation back as the API returned it and only appends, so the second call's
prompt extends the first call's tokens and the episode trains as one row.
"""

from openai import AsyncOpenAI

THINK = "Think about the problem step by step before you answer."
ANSWER = "What is your final answer? Reply as 'Answer: <integer>'."


async def run_episode(base_url: str, api_key: str, row: dict) -> None:
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        messages = [{"role": "system", "content": THINK}, *row["messages"]]
        thoughts = await client.chat.completions.create(model="policy", messages=messages, max_tokens=48)
        messages.append({"role": "assistant", "content": thoughts.choices[0].message.content})
        messages.append({"role": "user", "content": ANSWER})
        await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    return None
