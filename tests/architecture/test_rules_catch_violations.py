"""Each architecture rule fails on a synthetic tree that breaks it (a rule that cannot fail is no rule)."""

from pathlib import Path

import pytest

from tests.architecture.rules import ALLOWED_INTERNAL, MAX_MODULE_LINES, check_tree


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"stratarl/__init__.py": '"""pkg"""\n', **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text('"""pkg"""\n')
        path.write_text(text)
    return root


def rules_broken(tmp_path: Path, files: dict[str, str]) -> set[str]:
    return {v.rule for v in check_tree(make_tree(tmp_path, files))}


def test_clean_tree_passes(tmp_path):
    files = {
        "stratarl/algo/advantages.py": "import math\nimport torch\nfrom . import masked\n",
        "stratarl/algo/masked.py": "import numpy as np\n",
        "stratarl/trainer/fit.py": "from stratarl.cluster import handles\nfrom stratarl.algo import x\n",
        "stratarl/cluster/handles.py": "import ray\nfrom stratarl.engine import actor\n",
        "stratarl/engine/actor.py": "import torch.distributed as dist\nimport transformers\n",
        "stratarl/cli.py": (
            "from stratarl.trainer import fit\nfrom stratarl.engine import actor\n"
            "from stratarl.apps.quickstart import run_quickstart\n"
        ),
        "stratarl/trainer/phases.py": "from stratarl.rollout.interface import SamplingParams\n",
        "stratarl/trainer/sft.py": "from stratarl.run_directory.lock import RunLock\n",
        "stratarl/run_directory/checkpointing.py": (
            "from stratarl.config import RunConfig\n"
            "from stratarl.cluster.run_checkpoint import RunCheckpoint\n"
            "from stratarl.observe.run_log import write_atomically\n"
        ),
        "stratarl/apps/quickstart.py": (
            "from stratarl.trainer.rl_trainer import RLTrainer\nfrom stratarl.engine import actor\n"
            "from stratarl.run_directory import claim\nfrom stratarl.data.tasks import arithmetic\n"
        ),
        "stratarl/apps/tool_quickstart.py": "from .quickstart import tiny_model_for\n",
    }
    assert rules_broken(tmp_path, files) == set()


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("stratarl/algo/bad.py", "from stratarl.transport import data_proto\n"),
        ("stratarl/algo/bad.py", "from ..trainer import fit\n"),
        ("stratarl/transport/bad.py", "import stratarl.algo.kl\n"),
        ("stratarl/engine/bad.py", "from stratarl.trainer.fit import step\n"),
        ("stratarl/rollout/bad.py", "from stratarl import cluster\n"),
        ("stratarl/reward/bad.py", "from stratarl.config import schema\n"),
        ("stratarl/trainer/bad.py", "from stratarl.engine.actor import Actor\n"),
        ("stratarl/trainer/bad.py", "from stratarl.rollout.torch_engine import TorchRolloutEngine\n"),
        ("stratarl/observe/bad.py", "from stratarl.trainer import fit\n"),
        ("stratarl/run_directory/bad.py", "from stratarl.trainer.rl_trainer import RLTrainer\n"),
        ("stratarl/run_directory/bad.py", "from ..trainer import phases\n"),
        ("stratarl/run_directory/bad.py", "from stratarl.engine.checkpoint import CheckpointManager\n"),
        ("stratarl/cluster/bad.py", "from stratarl.run_directory.checkpointing import trainer_state\n"),
        ("stratarl/observe/bad.py", "from stratarl.run_directory import claim\n"),
    ],
)
def test_wrong_import_direction_is_caught(tmp_path, rel, source):
    assert "layer-direction" in rules_broken(tmp_path, {rel: source})


@pytest.mark.parametrize("package", sorted(set(ALLOWED_INTERNAL) - {"apps"}))
def test_no_package_imports_the_applications(tmp_path, package):
    """Only top-level modules (the CLI) run the quickstarts and `stratarl init`; a layer that imported
    them would depend on everything above it."""
    bad = {f"stratarl/{package}/bad.py": "from stratarl.apps.quickstart import run_quickstart\n"}
    assert "layer-direction" in rules_broken(tmp_path, bad)
    relative = {f"stratarl/{package}/bad.py": "from ..apps import task_init\n"}
    assert "layer-direction" in rules_broken(tmp_path, relative)


@pytest.mark.parametrize(
    ("rel", "source", "rule"),
    [
        ("stratarl/algo/bad.py", "import transformers\n", "third-party"),
        ("stratarl/transport/bad.py", "import pyarrow\n", "third-party"),
        ("stratarl/trainer/bad.py", "import ray\n", "reserved-module"),
        ("stratarl/engine/bad.py", "from ray.util import placement_group\n", "reserved-module"),
        ("stratarl/trainer/bad.py", "from torch.distributed.fsdp import fully_shard\n", "reserved-module"),
        ("stratarl/cluster/bad.py", "import torch.distributed as dist\n", "reserved-module"),
        ("stratarl/agent/bad.py", "from vllm import LLM\n", "reserved-module"),
        ("stratarl/algo/bad.py", "from torch import distributed\n", "reserved-module"),
    ],
)
def test_forbidden_third_party_import_is_caught(tmp_path, rel, source, rule):
    assert rule in rules_broken(tmp_path, {rel: source})


@pytest.mark.parametrize("name", ["utils", "helpers", "common", "misc"])
def test_grab_bag_module_names_are_caught(tmp_path, name):
    assert "module-name" in rules_broken(tmp_path, {f"stratarl/engine/{name}.py": '"""x"""\n'})
    assert "module-name" in rules_broken(tmp_path, {f"stratarl/reward/{name}/x.py": '"""x"""\n'})


def test_oversized_module_is_caught(tmp_path):
    just_fits = "x = 1\n" * (MAX_MODULE_LINES - 1)
    assert "module-size" not in rules_broken(tmp_path, {"stratarl/algo/ok.py": just_fits})
    too_long = "x = 1\n" * MAX_MODULE_LINES
    assert "module-size" in rules_broken(tmp_path, {"stratarl/algo/big.py": too_long})


def test_package_outside_the_layer_map_is_caught(tmp_path):
    assert "unknown-layer" in rules_broken(tmp_path, {"stratarl/extras/x.py": "import torch\n"})
