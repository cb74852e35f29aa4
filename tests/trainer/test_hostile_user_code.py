"""Hostile scorers and tools against short real training runs: every run finishes its steps, saves its
weights, and reports each failure in metrics (per data source), in the trajectory records and in the
run summary; what user code prints stays out of the log."""

import io
import json
import textwrap

import pytest
from rich.console import Console

from stratarl.observe.run_log import read_metrics
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_agent_rollout import tool_config
from tests.trainer.test_rl_trainer import small_config

HOSTILE_SCORER = textwrap.dedent(
    """
    import os, stat, struct, sys, time

    class NeedsTwoArguments(Exception):  # pickles as NeedsTwoArguments(msg): cannot be unpickled
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, mode="ok"):
        if mode == "half_message":  # to the worker's socket: a header promising 64 KiB, then 1 byte
            fd = next(fd for fd in range(3, 256) if _is_socket(fd))
            os.write(fd, struct.pack("!Q", 65536) + b"x")
            time.sleep(10**6)
        if mode == "unpicklable":
            return {"score": 1.0, "error": NeedsTwoArguments(1, 2)}
        if mode == "sleep":
            time.sleep(10**6)
        if mode == "exit0":
            os._exit(0)
        if mode == "sysexit":
            sys.exit(3)
        if mode == "print":
            print("x" * 2**20)
            return 0.5
        return 0.25  # a plain float: no extras at all

    def _is_socket(fd):
        try:
            return stat.S_ISSOCK(os.fstat(fd).st_mode)
        except OSError:
            return False
    """
)
STEPS = ["trainer.total_steps=2", "trainer.test_freq=2", "data.prompts_per_step=2", "rollout.n=2"]
STEPS += ["actor.prompts_per_mini_batch=2", "data.max_val_prompts=4"]


def hostile_run(config, tmp_path):
    """Train; return (metrics of the train steps, trajectory records, validation metrics, summary text)."""
    buffer = io.StringIO()
    trainer = RLTrainer(config, tmp_path / "run", console=Console(file=buffer, width=200))
    last_val = trainer.fit()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if r["phase"] == "train"]
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert (tmp_path / "run" / "final" / "config.json").exists()  # the run ended normally
    return train, [json.loads(line) for line in lines], last_val, buffer.getvalue()


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("sleep", "timeout"),
        ("exit0", "process_exit"),
        ("sysexit", "SystemExit"),
        ("half_message", "timeout"),  # the dispatcher never waits for the rest of a message
        ("unpicklable", "bad_return"),  # a result the trainer cannot unpickle costs its sample only
    ],
)
def test_a_scorer_that_hangs_or_exits_costs_its_samples_not_the_run(task, tmp_path, mode, reason):
    scorer = tmp_path / "hostile_reward.py"
    scorer.write_text(HOSTILE_SCORER)
    config = small_config(
        task,
        *STEPS,
        f"reward.custom_function_path={scorer}",
        f"reward.function_kwargs={{mode: {mode}}}",
        "reward.timeout_s=0.5",
        "reward.failure_score=-1.0",
    )
    train, trajectories, last_val, summary = hostile_run(config, tmp_path)
    assert [r["step"] for r in train] == [1, 2]
    for record in train:  # 2 prompts x 2 samples, every one failed
        assert record[f"reward/failures/{reason}"] == 4.0
        assert record[f"reward/failures/arithmetic/{reason}"] == 4.0
        assert record["critic/score/mean"] == -1.0  # reward.failure_score
    assert {t["reward_failure"] for t in trajectories} == {reason}
    assert {t["reward"] for t in trajectories} == {-1.0}
    assert last_val["val-aux/arithmetic/reward/mean@1"] == -1.0  # validation scored (and failed) too
    assert "reward failures" in summary and f"{reason}: 8" in summary


def test_a_scorer_printing_a_megabyte_per_call_is_counted_and_kept_out_of_the_log(task, tmp_path, capfd):
    scorer = tmp_path / "noisy_reward.py"
    scorer.write_text(HOSTILE_SCORER)
    config = small_config(
        task, *STEPS, f"reward.custom_function_path={scorer}", "reward.function_kwargs={mode: print}"
    )
    train, _, _, summary = hostile_run(config, tmp_path)
    for record in train:
        assert record["reward/output/bytes"] >= 4 * 2**20 and record["reward/output/capped_calls"] == 4.0
        assert record["reward/failures/total"] == 0.0 and record["critic/score/mean"] == 0.5
    out, err = capfd.readouterr()
    assert len(out) + len(err) + len(summary) < 200_000  # 12 MB were printed; the log holds a line per batch
    assert "reward failures" in summary and "none" in summary


def test_in_process_scoring_still_survives_a_raised_system_exit(task, tmp_path):
    scorer = tmp_path / "exiting_reward.py"
    scorer.write_text(HOSTILE_SCORER)
    config = small_config(
        task,
        *STEPS,
        "reward.in_process=true",
        f"reward.custom_function_path={scorer}",
        "reward.function_kwargs={mode: sysexit}",
    )
    train, _, _, _ = hostile_run(config, tmp_path)
    assert [r["reward/failures/SystemExit"] for r in train] == [4.0, 4.0]


AGENT_STEPS = ["data.prompts_per_step=2", "rollout.n=2", "actor.prompts_per_mini_batch=2"]
AGENT_STEPS += ["actor.trajectories_per_micro_batch=4", "data.max_val_prompts=4"]
HOSTILE_TOOLS = """
tools:
  - class_name: tests.agent.hostile_tools.{cls}
    config: {config}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluate an arithmetic expression exactly.
        parameters: {{type: object, properties: {{expression: {{type: string}}}}, required: [expression]}}
"""


@pytest.mark.parametrize(
    ("cls", "config", "reason"),
    [
        ("BlockingTool", "{seconds: 8}", "tool_timeout"),
        ("CancelSwallowingTool", "{}", "tool_timeout"),
        ("ExitingTool", "{}", "tool_SystemExit"),
        ("ExitingTool", "{hard: true}", "tool_process_exit"),
    ],
)
def test_a_tool_that_blocks_or_exits_is_a_counted_failure_and_the_run_goes_on(
    sft_tool_task, tmp_path, cls, config, reason
):
    tools = tmp_path / "tools.yaml"
    tools.write_text(HOSTILE_TOOLS.format(cls=cls, config=config))
    cfg = tool_config(
        sft_tool_task,
        *AGENT_STEPS,
        f"agent.tool_config_path={tools}",
        "agent.tool_timeout_s=1.0",
        "agent.tool_workers=4",
    )
    train, trajectories, last_val, summary = hostile_run(cfg, tmp_path)
    assert [r["step"] for r in train] == [1, 2]
    calls = [c for t in trajectories for turn in t["turns"] for c in turn["tool_calls"]]
    assert calls, "the model made no tool call"
    assert all(c["failure"] == reason.removeprefix("tool_") for c in calls)
    assert sum(r[f"agent/failures/{reason}"] for r in train) == len(calls)
    assert sum(r[f"agent/failures/tool_arithmetic/{reason}"] for r in train) == len(calls)
    assert "agent failures" in summary and f"{reason}: " in summary
    assert "val-core/tool_arithmetic/acc/mean@1" in last_val


@pytest.mark.parametrize(("mode", "reason"), [("float", None), ("sleep", "timeout")])
def test_streaming_rewards_survive_plain_floats_and_every_call_timing_out(
    sft_tool_task, tmp_path, mode, reason
):
    scorer = tmp_path / "streamed_reward.py"
    scorer.write_text(HOSTILE_SCORER)
    cfg = tool_config(
        sft_tool_task,
        *AGENT_STEPS,
        "agent.streaming_reward=true",
        f"reward.custom_function_path={scorer}",
        f"reward.function_kwargs={{mode: {mode}}}",
        "reward.timeout_s=0.3",
        "reward.num_workers=4",
        "trainer.test_freq=0",
    )
    train, trajectories, _, _ = hostile_run(cfg, tmp_path)
    assert [r["step"] for r in train] == [1, 2]
    if reason is None:
        assert all(r["critic/score/mean"] == 0.25 and r["reward/failures/total"] == 0.0 for r in train)
    else:
        assert all(r[f"reward/failures/{reason}"] == 4.0 for r in train)
        assert {t["reward_failure"] for t in trajectories} == {reason}
