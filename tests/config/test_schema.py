"""Every setting of the schema has a default and a one-line doc, and its names match the algo layer's."""

import dataclasses
import inspect

from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS
from stratarl.algo.policy_loss import POLICY_LOSSES
from stratarl.config import PolicyLossConfig, RunConfig
from stratarl.config.setting import SectionInfo, SettingInfo, leaf_settings, type_name, walk_settings

# Runtime objects a loss takes that are not settings (a torch.Generator for clip_cov's sampling).
RUNTIME_ARGUMENTS = {"generator"}


def test_every_setting_and_section_has_a_one_line_doc():
    infos = list(walk_settings(RunConfig))
    assert len([i for i in infos if isinstance(i, SettingInfo)]) > 80
    for info in infos:
        assert info.doc.strip(), f"{info.key} has no doc"
        assert "\n" not in info.doc, f"{info.key}: the doc must be one line"


def test_every_field_is_declared_with_a_default():
    # A dataclass field without a default would make RunConfig() fail; also check each carries metadata.
    RunConfig()
    for info in walk_settings(RunConfig):
        if isinstance(info, SectionInfo):
            for f in dataclasses.fields(info.cls):
                assert "doc" in f.metadata, f"{info.key}.{f.name} is not declared with setting()/section()"


def test_choices_contain_the_default():
    with_choices = {key: info for key, info in leaf_settings(RunConfig).items() if info.choices}
    assert {"model.dtype", "trainer.logger", "cluster.backend"} <= set(with_choices)
    for key, info in with_choices.items():
        values = info.default if isinstance(info.default, list) else [info.default]
        assert all(v is None or v in info.choices for v in values), key  # None: optional, off


def test_policy_loss_settings_cover_every_loss_hyperparameter_with_the_same_default():
    fields = {f.name: f for f in dataclasses.fields(PolicyLossConfig)}
    for name, loss in POLICY_LOSSES.items():
        parameters = inspect.signature(loss.fn).parameters
        for hyper in set(loss.hyperparameters) - RUNTIME_ARGUMENTS:
            assert hyper in fields, f"policy loss {name!r} takes {hyper!r}, which actor.policy_loss lacks"
            assert fields[hyper].default == parameters[hyper].default, f"{name}.{hyper}: defaults differ"


def test_algorithm_settings_are_estimator_hyperparameter_names():
    offered = set().union(*(estimator.hyperparameters for estimator in ADVANTAGE_ESTIMATORS.values()))
    assert {"gamma", "lam", "norm_adv_by_std"} <= offered


def test_type_names_read_like_annotations():
    infos = leaf_settings(RunConfig)
    assert type_name(infos["rollout.n"].type) == "int"
    assert type_name(infos["data.train_files"].type) == "list[str]"
    assert type_name(infos["critic.enable"].type) == "bool | None"
    assert infos["reward.function_kwargs"].accepts_any_subkey
    assert not infos["data.train_files"].accepts_any_subkey
