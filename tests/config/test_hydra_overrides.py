"""Hydra's override grammar as verl's scripts write it: +, ++, ~, lists, dicts, quotes, Hydra's scalars."""

import pytest

from stratarl.config.hydra_overrides import (
    ADD,
    DELETE,
    FORCE_ADD,
    SET,
    OverrideSyntaxError,
    parse_override,
    parse_value,
)


@pytest.mark.parametrize(
    ("text", "op", "key", "value"),
    [
        ("data.train_batch_size=1024", SET, "data.train_batch_size", 1024),
        ("+ray_kwargs.ray_init.address=10.0.0.1:6379", ADD, "ray_kwargs.ray_init.address", "10.0.0.1:6379"),
        ("++trainer.val_before_train=False", FORCE_ADD, "trainer.val_before_train", False),
        ("~trainer.use_v1", DELETE, "trainer.use_v1", None),
        ("actor_rollout_ref.actor.optim.lr=1e-6", SET, "actor_rollout_ref.actor.optim.lr", 1e-6),
        ("actor_rollout_ref.model.path=~/models/Qwen2.5-0.5B", SET, "actor_rollout_ref.model.path",
         "~/models/Qwen2.5-0.5B"),
        ("trainer.total_training_steps=null", SET, "trainer.total_training_steps", None),
        ("data.train_files=", SET, "data.train_files", ""),
    ],
)  # fmt: skip
def test_an_override_names_its_operation_key_and_value(text, op, key, value):
    parsed = parse_override(text)
    assert (parsed.op, parsed.key, parsed.value) == (op, key, value)
    assert type(parsed.value) is type(value)  # 1e-6 is a float (YAML 1.1 would read a string)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        # verl's scripts: train_files="['$gsm8k_train_path', '$math_train_path']", expanded by the shell
        ("['/d/gsm8k/train.parquet', '/d/math/train.parquet']", ["/d/gsm8k/train.parquet",
                                                                 "/d/math/train.parquet"]),
        ('["console","wandb"]', ["console", "wandb"]),  # trainer.logger='["console","wandb"]'
        ("[console,wandb]", ["console", "wandb"]),
        ("[0.9, 0.999]", [0.9, 0.999]),
        ("[]", []),
        ("[[1, 2], [3]]", [[1, 2], [3]]),
        ("{enable_thinking: false, k: 'a,b'}", {"enable_thinking": False, "k": "a,b"}),
        ("'1e-6'", "1e-6"),  # quoted: a string whatever it holds
        ('"[a,b]"', "[a,b]"),
        ("'it\\'s'", "it's"),
        ("TRUE", True),
        ("-1", -1),
        ("1_000", 1000),
        (".5", 0.5),
        ("inf", float("inf")),
        ("grpo", "grpo"),
        ("low_var_kl", "low_var_kl"),
    ],
)  # fmt: skip
def test_values_parse_as_hydra_parses_them(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("text", ["=3", "data.x", "a.b..c=1", "k=[a,b", "k='open", "k={a 1}", "k=[a] b"])
def test_a_malformed_override_is_one_error_naming_it(text):
    with pytest.raises(OverrideSyntaxError, match="'"):
        parse_override(text)
