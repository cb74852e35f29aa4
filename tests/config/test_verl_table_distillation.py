"""verl's `distillation.*` keys as ours: the teacher and the loss settings (the top-k loss's too)
translate, its chunking and the pool knobs are recorded as having no effect, several teachers
translate keyed by data_source, and our validation's refusal of k1 backpropagated comes back in
verl's names."""

import pytest

from stratarl.config import ConfigError
from stratarl.config.loading import load_config_data
from stratarl.config.verl_args import read_verl_args
from stratarl.config.verl_translation import load_verl_config, translate

DL = "distillation.distillation_loss"
TEACHER = "distillation.teacher_models.teacher_model"


def ours(*overrides):
    """The RunConfig of a verl command line, unvalidated (no data files here)."""
    return load_config_data(translate(read_verl_args(list(overrides))).settings)


def test_the_teacher_and_the_loss_settings_translate():
    cfg = ours(
        "distillation.enabled=true",
        f"{TEACHER}.model_path=/models/teacher",
        f"{DL}.loss_mode=k1",
        f"{DL}.use_policy_gradient=true",
        f"{DL}.use_task_rewards=false",
        f"{DL}.distillation_loss_coef=0.3",
        f"{DL}.loss_max_clamp=5.0",
        f"{DL}.clip_ratio=0.1",
        f"{DL}.clip_ratio_high=0.3",
        "trainer.n_gpus_per_node=1",
        "distillation.nnodes=1",
    )
    d = cfg.distillation
    assert (d.enabled, d.teacher_model_path, d.loss_mode) == (True, "/models/teacher", "k1")
    assert (d.use_policy_gradient, d.use_task_rewards, d.distillation_loss_coef) == (True, False, 0.3)
    assert (d.loss_max_clamp, d.clip_ratio_low, d.clip_ratio_high) == (5.0, 0.1, 0.3)


def test_verls_defaults_are_ours_when_distillation_is_off():
    d = ours().distillation
    assert (d.enabled, d.loss_mode, d.use_policy_gradient, d.loss_max_clamp) == (False, "k3", False, None)


def test_the_top_k_settings_translate_and_its_chunking_knobs_have_no_effect():
    d = ours(f"{DL}.loss_mode=forward_kl_topk", f"{DL}.topk=64", f"{DL}.log_prob_min_clamp=-5").distillation
    assert (d.loss_mode, d.topk, d.log_prob_min_clamp) == ("forward_kl_topk", 64, -5.0)
    translation = translate(read_verl_args([f"+{DL}.use_chunked_topk=true"]))
    recorded = {r["verl_key"]: r for r in translation.records}
    assert recorded[f"{DL}.use_chunked_topk"]["class"] == "no effect"
    assert "logit_chunk_size" in recorded[f"{DL}.use_chunked_topk"]["reason"]


def test_several_teachers_translate_keyed_by_data_source():
    line = [
        "+distillation.teacher_models.gsm.key=openai/gsm8k",
        "+distillation.teacher_models.gsm.model_path=/m1",
        "+distillation.teacher_models.geo.key=geometry",
        "+distillation.teacher_models.geo.model_path=/m2",
        "+distillation.teacher_models.geo.num_replicas=2",
    ]
    d = ours(f"{TEACHER}.model_path=/dropped", *line).distillation
    # verl drops the default entry teacher_model when others are given: no default teacher
    assert d.teachers == {"openai/gsm8k": "/m1", "geometry": "/m2"} and d.teacher_model_path == ""
    recorded = {r["verl_key"]: r for r in translate(read_verl_args(line)).records}
    assert recorded["distillation.teacher_models.gsm.key"]["ours"] == "distillation.teachers"
    assert recorded["distillation.teacher_models.geo.num_replicas"]["class"] == "no effect"
    one = ours(f"{TEACHER}.model_path=/one").distillation
    assert (one.teachers, one.teacher_model_path) == ({}, "/one")


def test_a_teacher_without_its_key_and_another_routing_field_are_refused():
    with pytest.raises(ConfigError) as err:
        ours("+distillation.teacher_models.t1.model_path=/m1", "+distillation.teacher_models.t2.key=a")
    assert "'t1' has no key" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ours("distillation.teacher_key=ability")
    assert "distillation.teacher_key" in str(err.value) and "data_source" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([f"{DL}.loss_mode=k1", f"{DL}.use_policy_gradient=false"], "use_policy_gradient"),
    ],
)
def test_our_validation_refuses_what_is_not_built(overrides, named):
    with pytest.raises(ConfigError) as err:  # also: no data files; the distillation problem is named
        load_verl_config(["distillation.enabled=true", f"{TEACHER}.model_path=/models/teacher", *overrides])
    assert named in str(err.value) and f"{DL}.loss_mode (our distillation.loss_mode)" in str(err.value)


def test_several_teachers_go_back_to_verl_and_a_default_teacher_is_listed_as_not_carried():
    from stratarl.config.verl_way_back import as_verl

    cfg = ours("distillation.enabled=true", "+distillation.teacher_models.t1.key=a",
               "+distillation.teacher_models.t1.model_path=/m1", "+distillation.teacher_models.t2.key=b",
               "+distillation.teacher_models.t2.model_path=/m2")  # fmt: skip
    line = as_verl(cfg)
    assert ours(*line.arguments()).distillation.teachers == {"a": "/m1", "b": "/m2"}
    cfg.distillation.teacher_model_path = "/default"
    not_carried = {key: why for key, _, why in as_verl(cfg).not_carried}
    assert "no default teacher" in not_carried["distillation.teachers"]
