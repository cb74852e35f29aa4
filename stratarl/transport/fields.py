"""Layer 4, data transport: the contract of every standard column of a batch, declared once.

Each `FieldSpec` says what a column holds: dtype kind, shape in the batch vocabulary (N rows, P
prompt tokens left-padded, T response tokens right-padded), the mask marking its meaningful
entries, the phase that produces it and the phases that consume it. `field_checks.validate`
enforces these declarations at phase boundaries; `field_docs` renders them for people
(`docs/fields.md`, `stratarl explain-field NAME`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The letters a shape may use; "P+T" is the full sequence (prompt ++ response).
SHAPE_LETTERS: dict[str, str] = {
    "N": "rows of the batch: trajectories, N = B·n (B prompts, n samples each)",
    "P": "prompt length, left-padded",
    "T": "response length, right-padded",
    "K": "tokens kept per position by a top-k column (distillation.topk)",
}

# dtype kind -> (description, accepted torch dtypes); None accepts a numpy array of any dtype.
DTYPE_KINDS: dict[str, tuple[str, frozenset[torch.dtype] | None]] = {
    "int64": ("torch.int64", frozenset({torch.int64})),
    "float": (
        "floating point (float32 by default; bf16/fp16/fp64 accepted)",
        frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16}),
    ),
    "mask": (
        "0/1 values, integer or bool (verl: int64)",
        frozenset({torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool}),
    ),
    "object": ("numpy array of Python objects (a non-tensor column)", None),
}

# The phases of one step (docs/design.md#one-step), in order; producers and consumers name them.
PHASES: tuple[str, ...] = (
    "dataloader",
    "expand",
    "rollout",
    "reward",
    "actor.log_prob",
    "reference.log_prob",
    "teacher.log_prob",
    "critic.value",
    "advantage",
    "critic.update",
    "actor.update",
    "metrics",
    "trace",
)

# The column that keys an update's per-row statistics back to their trajectory (the trace's question 9).
ROW_ID = "row_id"

FORWARD_PHASES = (
    "actor.log_prob",
    "reference.log_prob",
    "teacher.log_prob",
    "critic.value",
    "critic.update",
    "actor.update",
)


@dataclass(frozen=True)
class FieldSpec:
    """The contract of one column."""

    name: str
    dtype: str  # a key of DTYPE_KINDS
    shape: tuple[str, ...]  # letters of SHAPE_LETTERS, or "P+T"
    mask: str | None  # the column whose 1-entries mark where this one is meaningful
    producer: str
    consumers: tuple[str, ...]
    meaning: str

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(self.shape) + "]"


def _spec(
    name: str, dtype: str, shape: str, mask: str | None, producer: str, consumers: str, meaning: str
) -> tuple[str, FieldSpec]:
    """A declaration from space-separated shape letters and consumer phases."""
    shape_letters, consumer_phases = tuple(shape.split()), tuple(consumers.split())
    return name, FieldSpec(name, dtype, shape_letters, mask, producer, consumer_phases, meaning)


_RESP = "response_mask"
_ALL_RESPONSE = "reward actor.log_prob actor.update metrics trace"
# One declaration per line group: name, dtype kind, shape, mask, producer, consumers, meaning.
# fmt: off
FIELDS: dict[str, FieldSpec] = dict(
    [
        # ---- from the dataset and the expansion to n samples -------------------------------
        _spec("data_source", "object", "N", None, "dataloader", "reward metrics trace",
              "name of the dataset the prompt came from; selects the reward function"),
        _spec("reward_model", "object", "N", None, "dataloader", "reward",
              "dict {style, ground_truth} from the dataset row (verl parquet schema)"),
        _spec("extra_info", "object", "N", None, "dataloader", "reward trace",
              "dict from the dataset row: split, index and task-specific entries"),
        _spec("agent_name", "object", "N", None, "dataloader", "rollout",
              "the row's agent loop (multi-turn): the dataset's agent_name column, None for "
              "agent.default_agent"),
        _spec("uid", "object", "N", None, "expand", "advantage trace",
              "id of the prompt, shared by its n samples: the group of group-relative estimators"),
        _spec("sample_index", "int64", "N", None, "expand", "trace",
              "index of this trajectory among the n samples of its prompt, 0..n-1"),
        _spec("queue_key", "object", "N", None, "rollout",
              "actor.log_prob reference.log_prob teacher.log_prob critic.value critic.update actor.update",
              "the row's key in the TransferQueue (cluster.backend=ray): workers read and write its "
              "fields there; absent in one process"),
        # ---- rollout: token-in/token-out trajectories -------------------------------------------
        _spec("prompts", "int64", "N P", "attention_mask", "rollout", "reward metrics trace",
              "prompt token ids (chat-templated), left-padded; the mask is attention_mask[:, :P]"),
        _spec("responses", "int64", "N T", _RESP, "rollout", _ALL_RESPONSE,
              "response token ids, generated tokens and tool/observation tokens alike, right-padded"),
        _spec("input_ids", "int64", "N P+T", "attention_mask", "rollout", " ".join(FORWARD_PHASES),
              "prompts ++ responses: the sequence every forward pass reads"),
        _spec("attention_mask", "mask", "N P+T", None, "rollout", " ".join(FORWARD_PHASES),
              "1 on real tokens of input_ids (prompt and response), 0 on padding"),
        _spec("position_ids", "int64", "N P+T", "attention_mask", "rollout", " ".join(FORWARD_PHASES),
              "position of each token counted over real tokens only (0 at the first prompt token)"),
        _spec(_RESP, "mask", "N T", None, "rollout", "reward advantage critic.update actor.update metrics",
              "1 on tokens the policy generated; 0 on observations (tool results, user turns) and padding"),
        _spec("rollout_log_probs", "float", "N T", _RESP, "rollout", "actor.update metrics",
              "log π_rollout(token): log-probs reported by the sampler (bypass mode, rollout correction)"),
        _spec("weight_version", "int64", "N", None, "rollout", "actor.update metrics trace",
              "version of the policy weights that generated the trajectory (the oldest of its tokens': "
              "async_training.partial_rollout=continue may switch versions mid-response); "
              "staleness = trained − this"),
        _spec("token_weight_version", "int64", "N T", _RESP, "rollout", "metrics trace",
              "version of the policy weights that sampled each response token (-1 on observations and "
              "padding); ≥ weight_version, more than one value only for a response continued across a "
              "weight push"),
        _spec("finish_reason", "object", "N", None, "rollout", "metrics trace",
              "why generation stopped: 'stop' (EOS or a stop string) or 'length' (max tokens ran out)"),
        _spec("replica_id", "object", "N", None, "rollout", "trace",
              "the rollout engine (replica) that served the trajectory's first turn"),
        # ---- scoring and forward passes -------------------------------------------------------
        _spec("token_level_scores", "float", "N T", _RESP, "reward", "advantage metrics",
              "the outcome reward on the last action token of the response, 0 elsewhere"),
        _spec("old_log_probs", "float", "N T", _RESP, "actor.log_prob", "advantage actor.update metrics",
              "log π_old(token): the actor's log-probs before this step's updates (PPO ratio denominator)"),
        _spec("entropys", "float", "N T", _RESP, "actor.log_prob", "metrics",
              "entropy of the actor's next-token distribution at each response position"),
        _spec("sum_pi_squared", "float", "N T", _RESP, "actor.log_prob", "advantage",
              "Σ_v π_old(v)² of the actor's next-token distribution (optimal-token-baseline estimators)"),
        _spec("ref_log_prob", "float", "N T", _RESP, "reference.log_prob", "advantage actor.update metrics",
              "log π_ref(token) of the frozen reference policy (KL loss or KL-in-reward)"),
        _spec("teacher_log_prob", "float", "N T", _RESP, "teacher.log_prob", "actor.update metrics",
              "log π_teacher(token) of the frozen distillation teacher on the student's own tokens"),
        _spec("teacher_top_k_ids", "int64", "N T K", _RESP, "teacher.log_prob", "actor.update",
              "the teacher's K most likely token ids at each response position, most likely first "
              "(distillation.loss_mode=forward_kl_topk)"),
        _spec("teacher_top_k_log_probs", "float", "N T K", _RESP, "teacher.log_prob", "actor.update",
              "log π_teacher of teacher_top_k_ids: the student's update scores log π_θ at the same ids"),
        _spec("values", "float", "N T", _RESP, "critic.value", "advantage critic.update metrics",
              "V(s_t): the critic's value estimate at each response position, before the update"),
        # ---- RL math --------------------------------------------------------------------------
        _spec("token_level_rewards", "float", "N T", _RESP, "advantage", "advantage metrics",
              "token_level_scores − β·KL(π_old‖π_ref) per token when KL is in the reward, else the scores"),
        _spec("advantages", "float", "N T", _RESP, "advantage", "actor.update metrics trace",
              "Â_t from the configured estimator (GAE, GRPO, RLOO, ...), 0 outside the mask"),
        _spec("returns", "float", "N T", _RESP, "advantage", "critic.update metrics",
              "regression targets of the critic (Â_t + V(s_t) for GAE)"),
        _spec("rollout_is_weights", "float", "N T", _RESP, "advantage", "actor.update metrics",
              "truncated importance weights π_old/π_rollout of rollout correction"),
        _spec(ROW_ID, "int64", "N", None, "trace", "actor.update trace",
              "the row's index in the step's trained batch (only while tracing): the actor's update "
              "returns its per-row statistics (new log-prob, ratio, clipped share) under it"),
    ]
)
# fmt: on


def field_spec(name: str) -> FieldSpec:
    """The declaration of `name`; KeyError listing the declared names when there is none."""
    if name not in FIELDS:
        raise KeyError(f"no field contract for {name!r}; declared fields: {sorted(FIELDS)}")
    return FIELDS[name]
