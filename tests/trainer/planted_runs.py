"""What the doctor's real-run tests share: the quickstart's arithmetic task after a short SFT (GRPO
then sees groups whose rewards differ, as in the quickstart), and an 8-step GRPO run of it with
overrides, diagnosed."""

from pathlib import Path

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets
from stratarl.config import load_config
from stratarl.observe.doctor.diagnosis import diagnose
from stratarl.observe.doctor.view import Finding, load_run
from stratarl.observe.run_log import RunLog
from stratarl.trainer.rl_trainer import RLTrainer
from stratarl.trainer.sft import run_sft, sft_worker


def overrides(task: dict, *extra: str) -> list[str]:
    return [
        f"data.train_files=[{task['train']}]",
        f"data.val_files=[{task['test']}]",
        f"model.path={task['model']}",
        "data.prompts_per_step=8",
        "rollout.n=4",
        "rollout.max_response_tokens=8",
        "actor.prompts_per_mini_batch=4",  # two optimizer steps per update
        "actor.trajectories_per_micro_batch=16",
        "actor.lr=3e-4",
        "trainer.total_steps=8",
        "trainer.test_freq=8",
        "trainer.val_before_train=false",
        *extra,
    ]


def run(task: dict, run_dir: Path, *extra: str) -> list[Finding]:
    RLTrainer(load_config(RECIPE, overrides(task, *extra)), run_dir).fit()
    return diagnose(load_run(run_dir))


def alarming(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity != "info"]


def sft_model(task: dict, root: Path) -> dict:
    """The arithmetic task and its 1M model after 80 SFT steps (about 10 s on 2 cores)."""
    sft = ["sft.lr=3e-3", "sft.lr_schedule=constant", "sft.trajectories_per_step=32"]
    cfg = load_config(RECIPE, overrides(task, *sft, "sft.trajectories_per_micro_batch=32"))
    tokenizer = datasets.load_tokenizer(cfg)
    dataset = datasets.load_prompts(cfg.data.train_files, tokenizer, max_prompt_tokens=64, limit=None)
    worker = sft_worker(cfg, tokenizer, total_steps=80)
    run_sft(
        worker, dataset, tokenizer, examples_per_step=32, total_steps=80, seed=0, log=RunLog(root / "sft")
    )
    worker.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return {**task, "model": root / "model"}
