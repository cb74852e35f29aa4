"""Numbers a run cannot hold (inf, beyond 32 bits, a negative seed) are refused at validation, naming
the key, and `stratarl train` exits 2 with the message before anything loads."""

import subprocess
import sys

import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.config import ConfigError, load_config, validate_config


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "rollout.max_response_tokens=100000000000000000000",
            "rollout.max_response_tokens: must fit in 32 bits",
        ),
        ("actor.lr=inf", "actor.lr: must be a finite number, got inf"),
        ("actor.betas=[0.9,-inf]", "actor.betas: must be a finite number, got -inf"),
        ("trainer.seed=-1", "trainer.seed: a seed must be in [0, 2^32), got -1"),
        ("data.seed=4294967296", "data.seed: a seed must be in [0, 2^32), got 4294967296"),
    ],
)
def test_a_number_a_run_cannot_hold_is_refused_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(RECIPE, [override]), check_paths=False)
    assert expected in str(info.value)


def test_the_largest_seed_and_int32_pass():
    validate_config(load_config(RECIPE, ["trainer.seed=4294967295"]), check_paths=False)


def test_the_cli_refuses_an_infinite_learning_rate_with_exit_2_and_no_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "stratarl", "train", str(RECIPE), "actor.lr=inf",
         f"trainer.run_dir={tmp_path}/r"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "actor.lr: must be a finite number, got inf" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()  # refused before the run directory was touched
