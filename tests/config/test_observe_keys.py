"""trace.* and watchdog.* settings: bad values are refused before anything starts, naming the key."""

import pytest

from stratarl.apps.quickstart import RECIPE
from stratarl.config import ConfigError, load_config, validate_config


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trace.fraction=0", "trace.fraction"),
        ("trace.fraction=1.5", "trace.fraction"),
        ("trace.max_trajectories_per_step=0", "trace.max_trajectories_per_step"),
        ("trace.max_total_mb=0", "trace.max_total_mb"),
        ("watchdog.phase_timeouts_s={genn: 5}", "watchdog.phase_timeouts_s.genn"),
        ("watchdog.phase_timeouts_s={gen: -1}", "watchdog.phase_timeouts_s.gen"),
        ("watchdog.floor_s=0", "watchdog.floor_s"),
        ("watchdog.warmup_steps=0", "watchdog.warmup_steps"),
    ],
)
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as error:
        validate_config(load_config(RECIPE, [override]), check_paths=False)
    assert key in str(error.value)


def test_good_values_pass():
    cfg = load_config(RECIPE, ["trace.fraction=0.25", "watchdog.phase_timeouts_s={gen: 60, reward: 5}"])
    validate_config(cfg, check_paths=False)
    assert cfg.watchdog.phase_timeouts_s == {"gen": 60, "reward": 5}
