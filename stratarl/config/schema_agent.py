"""Layer 1, config: multi-turn agent rollout, `agent.*` (verl's `rollout.multi_turn.*`, `rollout.agent.*`).

With `agent.enable` the trainer's generate phase runs episodes of the agent loop (generate → parse
tool calls → run tools → append observations → generate …) instead of one generation per prompt;
validation does too. The keys become `stratarl.agent.tool_loop.LoopLimits` in the trainer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from stratarl.config.errors import ConfigProblem
from stratarl.config.setting import section, setting

MT = "actor_rollout_ref.rollout.multi_turn"  # verl's prefix of the multi-turn settings
AGENT_LOOPS = ("tool_agent", "single_turn_agent")
TRUNCATE_SIDES = ("head", "tail", "middle")


@dataclass
class GatewayConfig:
    """Train an agent program of your own: it talks to the policy through an OpenAI-compatible
    endpoint the trainer serves during generation and validation (docs/agent_gateway.md)."""

    enable: bool = setting(
        False,
        "run agent.gateway.agent_function_path's function once per rollout row instead of the built-in "
        "tool loop; its OpenAI calls are served by the rollout engine and trained token for token",
    )
    agent_function_path: str = setting(
        "", "Python file defining the agent: async def run_episode(base_url, api_key, row) -> reward"
    )
    agent_function_name: str = setting("run_episode", "name of the async agent function in that file")
    episode_timeout_s: float = setting(
        300.0, "seconds one episode may run; then it is cancelled, counted, and not trained on"
    )
    max_concurrent_episodes: int = setting(64, "episodes running at once (their calls share engine batches)")
    num_workers: int = setting(
        2,
        "agent worker processes (contained as the tool workers are); each runs its share of the "
        "episodes concurrently on its own event loop, and one its agent blocks, exits or crashes is replaced",
    )
    in_process: bool = setting(
        False,
        "run the agent in the trainer's own event loop instead (a debugger steps into it; an agent that "
        "blocks stalls every episode and one calling os._exit ends the run)",
    )
    max_prompt_tokens: int = setting(
        4096, "longest prompt one call may send; longer ones get a 400 context_length_exceeded"
    )
    keep_sampled_ids: bool = setting(
        True,
        "a chat prompt whose text begins with an earlier call's prompt + response text keeps that call's "
        "ids for it (only the rest is tokenized), so a re-tokenized answer does not split the episode",
    )


@dataclass
class AgentConfig:
    """Episodes with tools and interactions. `rollout.max_response_tokens` (T) is the budget of the
    whole response: every assistant turn AND every observation appended after it."""

    enable: bool = setting(
        False, "run the agent loop in the generate phase and in validation", verl=f"{MT}.enable"
    )
    default_agent: str = setting(
        "tool_agent",
        "agent loop of rows whose dataset row names none (its agent_name column)",
        verl="actor_rollout_ref.rollout.agent.default_agent_loop",
        choices=AGENT_LOOPS,
    )
    tool_config_path: str = setting(
        "", "YAML tool config (verl's format); empty: no tools", verl=f"{MT}.tool_config_path"
    )
    interaction_config_path: str = setting(
        "", "YAML interaction config; empty: no interactions", verl=f"{MT}.interaction_config_path"
    )
    max_assistant_turns: int | None = setting(
        None, "stop after this many assistant turns; null: no limit", verl=f"{MT}.max_assistant_turns"
    )
    max_user_turns: int | None = setting(
        None,
        "stop after this many observations (tool results, interaction replies); null: no limit",
        verl=f"{MT}.max_user_turns",
    )
    tool_format: str = setting(
        "hermes", "tool-call format the model writes", verl=f"{MT}.format", choices=("hermes", "llama3_json")
    )
    on_parse_error: str = setting(
        "terminate",
        "a malformed tool call ends the episode, or is answered with the parse error as a tool message",
        choices=("terminate", "feedback"),
    )
    tool_timeout_s: float = setting(
        10.0, "seconds one tool call may take; at the deadline the call is an error and a counted failure"
    )
    tools_in_process: bool = setting(
        False,
        "run tool calls in threads of the trainer's process (deadlines hold for blocking tools, but a tool "
        "calling os._exit or crashing ends the run); false: agent.tool_workers worker processes",
    )
    tool_workers: int = setting(2, "tool worker processes (a call that times out or exits costs its worker)")
    max_tool_output_bytes: int = setting(
        4096, "bytes of what one tool call prints (not its result) that are kept; the rest is dropped"
    )
    interaction_timeout_s: float = setting(
        30.0, "seconds one interaction call may take; a timeout ends the episode (interaction_error)"
    )
    max_parallel_calls: int = setting(
        1, "tool calls run per assistant turn (extra calls are dropped)", verl=f"{MT}.max_parallel_calls"
    )
    max_tool_response_chars: int = setting(
        256, "a longer tool result is truncated", verl=f"{MT}.max_tool_response_length"
    )
    truncate_side: str = setting(
        "middle",
        "what truncation keeps: the head, the tail, or both ends (verl's left/right are head/tail)",
        verl=f"{MT}.tool_response_truncate_side",
        choices=TRUNCATE_SIDES,
    )
    streaming_reward: bool = setting(
        False, "score each episode as it finishes (reward.* scorers), overlapping generation"
    )
    gateway: GatewayConfig = section(
        GatewayConfig, "an OpenAI-compatible endpoint for your own agent program"
    )


def agent_problems(
    agent: AgentConfig, *, adv_estimator: str, check_paths: bool = True
) -> list[ConfigProblem]:
    """The problems of `agent.*` (part of `validate_config`): ranges, config files that do not exist
    (with check_paths), and combinations the loop cannot run."""
    if not agent.enable:
        return []
    checks = [
        (agent.max_parallel_calls < 1, "agent.max_parallel_calls", "must be ≥ 1"),
        (agent.tool_timeout_s <= 0, "agent.tool_timeout_s", "must be > 0"),
        (agent.max_tool_response_chars < 1, "agent.max_tool_response_chars", "must be ≥ 1"),
        (agent.tool_workers < 1, "agent.tool_workers", "must be ≥ 1"),
        (agent.interaction_timeout_s <= 0, "agent.interaction_timeout_s", "must be > 0"),
        (agent.max_tool_output_bytes < 0, "agent.max_tool_output_bytes", "must be ≥ 0"),
        (
            agent.max_assistant_turns is not None and agent.max_assistant_turns < 1,
            "agent.max_assistant_turns",
            "must be ≥ 1 or null",
        ),
        (
            agent.max_user_turns is not None and agent.max_user_turns < 1,
            "agent.max_user_turns",
            "must be ≥ 1 or null",
        ),
    ]
    problems = [ConfigProblem((key,), message) for fails, key, message in checks if fails]
    for key in ("agent.tool_config_path", "agent.interaction_config_path") if check_paths else ():
        path = getattr(agent, key.partition(".")[2])
        if path and not Path(path).is_file():
            problems.append(ConfigProblem((key,), f"file not found: {path}"))
    if adv_estimator == "remax":
        problems.append(
            ConfigProblem(
                ("agent.enable", "algorithm.adv_estimator"),
                "remax's greedy baseline is a single-turn generation; it is not defined for agent episodes",
            )
        )
    return problems


def gateway_problems(
    gateway: GatewayConfig,
    *,
    agent_enable: bool,
    adv_estimator: str,
    filter_groups: bool,
    check_paths: bool = True,
) -> list[ConfigProblem]:
    """The problems of `agent.gateway.*` (part of `validate_config`): ranges, the agent file and its
    function (found by parsing the file, nothing is run here), and what is not built with it."""
    if not gateway.enable:
        return []
    checks = [
        (gateway.episode_timeout_s <= 0, ("agent.gateway.episode_timeout_s",), "must be > 0"),
        (gateway.max_concurrent_episodes < 1, ("agent.gateway.max_concurrent_episodes",), "must be ≥ 1"),
        (gateway.num_workers < 1, ("agent.gateway.num_workers",), "must be ≥ 1"),
        (gateway.max_prompt_tokens < 1, ("agent.gateway.max_prompt_tokens",), "must be ≥ 1"),
        (
            agent_enable,
            ("agent.enable", "agent.gateway.enable"),
            "choose one: the built-in tool loop (agent.enable) or your own agent program (agent.gateway)",
        ),
        (
            filter_groups,
            ("agent.gateway.enable", "algorithm.filter_groups.enable"),
            "dynamic sampling is not built for gateway rows (an episode may give several rows)",
        ),
        (
            adv_estimator == "remax",
            ("agent.gateway.enable", "algorithm.adv_estimator"),
            "remax's greedy baseline is a single-turn generation; it is not defined for agent episodes",
        ),
    ]
    problems = [ConfigProblem(keys, message) for fails, keys, message in checks if fails]
    return problems + _agent_file_problems(gateway, check_paths=check_paths)


def _agent_file_problems(gateway: GatewayConfig, *, check_paths: bool) -> list[ConfigProblem]:
    path_key, name_key = "agent.gateway.agent_function_path", "agent.gateway.agent_function_name"
    path = gateway.agent_function_path
    if not path:
        return [ConfigProblem((path_key,), "is required with agent.gateway.enable=true")]
    if not check_paths:
        return []
    if not Path(path).is_file():
        return [ConfigProblem((path_key,), f"file not found: {path}")]
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (SyntaxError, ValueError, UnicodeDecodeError) as err:
        return [ConfigProblem((path_key,), f"{path} is not valid Python: {err}")]
    name = gateway.agent_function_name
    defined = {
        node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if name not in defined:
        return [ConfigProblem((name_key,), f"{path} defines no top-level function {name!r}")]
    if not isinstance(defined[name], ast.AsyncFunctionDef):
        return [
            ConfigProblem((name_key,), f"{name!r} in {path} must be an `async def` (base_url, api_key, row)")
        ]
    return []
