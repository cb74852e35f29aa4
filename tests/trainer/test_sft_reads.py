"""SFT_READS against the code: `stratarl sft` runs with a config that records every setting the
package reads (validation and the warnings aside), and the keys read over a few runs that take its
conditional paths are exactly SFT_READS."""

import dataclasses
import sys
from pathlib import Path

import stratarl
from stratarl import cli, config
from stratarl.apps.quickstart import RECIPE
from stratarl.config.sft_scope import SFT_READS

PACKAGE = str(Path(stratarl.__file__).parent)
NOT_READS = {"validate_config", "sft_warnings"}  # they read every key they check, to decide
SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str.strip() == ground_truth) + bonus
"""


def record_reads(cfg, read: set[str], prefix: str = "") -> None:
    """Make every section of `cfg` add to `read` the dotted key of each setting that code of the
    package reads from it (not the dataclasses or OmegaConf machinery that saves the config)."""
    names = {f.name for f in dataclasses.fields(cfg)}
    for name in names:
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            record_reads(value, read, f"{prefix}{name}.")
    section_class = type(cfg)

    def __getattribute__(self, name):
        value = section_class.__getattribute__(self, name)
        if name in names and not dataclasses.is_dataclass(value) and _read_by_the_package():
            read.add(prefix + name)
        return value

    cfg.__class__ = type(section_class.__name__, (section_class,), {"__getattribute__": __getattribute__})


def _read_by_the_package() -> bool:
    frame = sys._getframe(2)
    if not frame.f_code.co_filename.startswith(PACKAGE):
        return False
    while frame is not None:
        if frame.f_code.co_name in NOT_READS:
            return False
        frame = frame.f_back
    return True


def keys_read(monkeypatch, *overrides: str, command: str = "sft") -> set[str]:
    """The settings `stratarl <command>` read on the quickstart recipe with `overrides`."""
    read: set[str] = set()
    load = config.load_config

    def recording_load(recipe, overrides=()):
        cfg = load(recipe, overrides)
        record_reads(cfg, read)
        return cfg

    monkeypatch.setattr(config, "load_config", recording_load)
    assert cli.main([command, str(RECIPE), *overrides]) == 0
    return read


def test_stratarl_sft_reads_exactly_keys_read(task, tmp_path, monkeypatch):
    scorer = tmp_path / "exact.py"
    scorer.write_text(SCORER)
    common = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        f"model.path={task['model']}",
        "data.max_train_prompts=16",
        "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
    ]
    fixed = [*common, f"trainer.run_dir={tmp_path / 'fixed'}", "sft.total_steps=1"]
    read = keys_read(monkeypatch, *fixed)
    read |= keys_read(monkeypatch, *fixed, "trainer.overwrite=true")  # a run is there: moved aside
    read |= keys_read(
        monkeypatch,
        *common,
        f"trainer.output_root={tmp_path / 'out'}",  # no trainer.run_dir: project/experiment under it
        "sft.total_steps=null",  # the length from sft.total_epochs
        "rollout.val_kwargs.greedy=false",
        f"reward.custom_function_path={scorer}",
        "reward.function_kwargs={bonus: 0.5}",
        "cluster.backend=ray",  # the device from the training workers' GPUs; SFT runs in this process
    )
    # its own rows: data.train_files is then read by validation only
    own_rows = f"sft.train_files=['{task['train']}']"
    own_dir = f"trainer.run_dir={tmp_path / 'own'}"
    read |= keys_read(monkeypatch, *common, own_rows, "sft.total_steps=1", own_dir)
    assert read - SFT_READS == set(), "stratarl sft reads keys SFT_READS leaves out"
    assert SFT_READS - read == set(), "SFT_READS lists keys stratarl sft never read here"


def test_stratarl_train_reads_no_sft_setting(task, tmp_path, monkeypatch):
    """The recipe is shared; sft.* (sft.train_files among them) is SFT's alone."""
    read = keys_read(
        monkeypatch,
        f"data.train_files=['{task['train']}']",
        f"sft.train_files=['{task['train']}']",
        f"model.path={task['model']}",
        "data.val_files=[]",
        f"trainer.run_dir={tmp_path / 'rl'}",
        "trainer.total_steps=1",
        "data.prompts_per_step=4",
        "actor.prompts_per_mini_batch=4",
        "actor.trajectories_per_micro_batch=32",
        command="train",
    )
    assert "data.train_files" in read and {key for key in read if key.startswith("sft.")} == set()
