"""Field contracts: the declarations, validate() on good and broken batches, explain_field, docs/fields.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stratarl.transport.data_proto import DataProto
from stratarl.transport.field_checks import FieldContractError, validate
from stratarl.transport.field_docs import explain_field, render_fields_markdown
from stratarl.transport.fields import DTYPE_KINDS, FIELDS, PHASES, SHAPE_LETTERS
from stratarl.transport.transfer_queue import TransferQueue

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = [
    *("prompts", "input_ids", "attention_mask", "position_ids", "responses", "response_mask"),
    *("rollout_log_probs", "old_log_probs", "ref_log_prob", "values", "entropys"),
    *("token_level_scores", "token_level_rewards", "advantages", "returns"),
    *("uid", "sample_index", "weight_version", "data_source", "reward_model", "extra_info"),
]

N, P, T = 4, 3, 5


def step_batch() -> DataProto:
    """A well-formed batch after the advantage phase: N=4 rows, P=3 prompt and T=5 response tokens."""
    response_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 1, 0]])
    attention_mask = torch.cat(
        [torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]]), response_mask], dim=1
    )
    floats = {name: torch.randn(N, T) for name in ("old_log_probs", "ref_log_prob", "values", "advantages")}
    floats["old_log_probs"][0, 4] = float("nan")  # under response_mask == 0: allowed
    return DataProto.from_columns(
        {
            "prompts": torch.randint(0, 50, (N, P)),
            "responses": torch.randint(0, 50, (N, T)),
            "input_ids": torch.randint(0, 50, (N, P + T)),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "weight_version": torch.zeros(N, dtype=torch.int64),
            **floats,
            "uid": ["a", "a", "b", "b"],
        }
    )


def test_every_required_field_is_declared_consistently():
    assert set(REQUIRED) <= set(FIELDS)
    for name, spec in FIELDS.items():
        assert spec.name == name and spec.dtype in DTYPE_KINDS and spec.meaning
        assert spec.producer in PHASES and spec.consumers and set(spec.consumers) <= set(PHASES), name
        assert all(dim in SHAPE_LETTERS or dim == "P+T" for dim in spec.shape), name
        assert spec.shape[0] == "N", name
        assert spec.mask is None or FIELDS[spec.mask].dtype == "mask", name


def test_a_well_formed_batch_passes():
    batch = step_batch()
    validate(
        batch, reads=["input_ids", "attention_mask", "position_ids", "responses"], phase="actor.log_prob"
    )
    validate(
        batch, reads=["old_log_probs", "advantages", "response_mask"], writes=["values"], phase="actor.update"
    )
    validate(batch, reads=["prompts", "uid", "weight_version"], phase="trace")


def test_missing_field_names_the_field_and_phase():
    batch = step_batch().select(["responses", "response_mask"])
    with pytest.raises(
        FieldContractError, match=r"phase 'actor\.update' reads 'old_log_probs', but the batch has no"
    ):
        validate(batch, reads=["old_log_probs"], phase="actor.update")
    with pytest.raises(FieldContractError, match=r"writes 'values'.*after the phase ran"):
        validate(batch, writes=["values"], phase="critic.value")


def test_wrong_dtype_is_rejected():
    batch = step_batch()
    batch.batch["old_log_probs"] = torch.zeros(N, T, dtype=torch.int64)
    with pytest.raises(
        FieldContractError, match=r"'old_log_probs': expected floating point.*got dtype int64"
    ):
        validate(batch, reads=["old_log_probs"], phase="actor.update")
    batch = step_batch()
    batch.batch["uid"] = torch.zeros(N)
    batch.non_tensor_batch.pop("uid")
    with pytest.raises(FieldContractError, match="'uid': expected numpy array of Python objects"):
        validate(batch, reads=["uid"], phase="advantage")


def test_inconsistent_shapes_name_expected_and_actual_shape():
    batch = step_batch()
    batch.batch["advantages"] = torch.zeros(N, T + 1)
    with pytest.raises(FieldContractError) as caught:
        validate(batch, reads=["responses", "advantages"], phase="actor.update")
    message = str(caught.value)
    assert "phase 'actor.update' reads 'advantages'" in message
    assert "expected shape [N, T] = [4, 5], got [4, 6]" in message and "T=5 was set by 'responses'" in message
    with pytest.raises(FieldContractError, match=r"expected shape \[N, T\], got \[4\]"):
        validate(step_batch().union(DataProto.from_columns({"returns": torch.zeros(N)})), reads=["returns"])


def test_full_sequence_must_be_prompt_plus_response():
    batch = step_batch()
    batch.batch["input_ids"] = torch.zeros(N, P + T + 2, dtype=torch.int64)
    with pytest.raises(FieldContractError, match=r"P\+T"):  # bound after P and T: compared directly
        validate(batch, reads=["prompts", "responses", "input_ids"], phase="actor.log_prob")
    with pytest.raises(FieldContractError, match=r"'input_ids' has P\+T=10 .* P=3 .* T=5"):  # bound first
        validate(
            batch.select(["input_ids", "prompts", "responses"]), reads=["input_ids", "prompts", "responses"]
        )


def test_masks_must_be_zero_or_one():
    batch = step_batch()
    batch.batch["response_mask"][2, 3] = 2
    with pytest.raises(FieldContractError, match="'response_mask': a mask must hold only 0/1, found 2"):
        validate(batch, reads=["response_mask"], phase="advantage")


def test_non_finite_values_under_the_mask_are_rejected_but_not_outside_it():
    batch = step_batch()
    validate(batch, reads=["old_log_probs"], phase="actor.update")  # the NaN at [0, 4] is masked out
    batch.batch["old_log_probs"][3, 1] = float("inf")
    with pytest.raises(
        FieldContractError, match=r"1 non-finite value\(s\) under 'response_mask', first at \[3, 1\]"
    ):
        validate(batch, reads=["old_log_probs"], phase="actor.update")


def test_undeclared_fields_are_refused():
    with pytest.raises(FieldContractError, match="no field contract declares"):
        validate(step_batch(), reads=["old_log_prob"], phase="actor.update")


def test_validate_checks_a_kv_batch_meta_without_its_data():
    queue = TransferQueue.in_process(2)
    meta = queue.put(step_batch(), "train/step-0")
    validate(meta, reads=["responses", "old_log_probs", "input_ids", "prompts"], phase="actor.update")
    bad = queue.put({"values": torch.zeros(N, T + 2)}, meta=meta)
    with pytest.raises(
        FieldContractError, match=r"'values': expected shape \[N, T\] = \[4, 5\], got \[4, 7\]"
    ):
        validate(bad, reads=["responses", "values"], phase="critic.update")


def test_explain_field_prints_the_contract():
    text = explain_field("old_log_probs")
    for part in ("old_log_probs:", "[N, T]", "response_mask", "actor.log_prob", "actor.update", "float"):
        assert part in text
    with pytest.raises(KeyError, match="declared fields"):
        explain_field("no_such_field")


def test_docs_fields_md_is_generated_from_the_declarations():
    text = render_fields_markdown()
    assert all(f"| `{name}` |" in text for name in FIELDS)
    current = (ROOT / "docs" / "fields.md").read_text(encoding="utf-8")
    assert current == text, (
        "docs/fields.md is stale: run stratarl.transport.field_docs.write_fields_markdown()"
    )
