"""Layer 3, orchestration: the distillation teacher role — the frozen teachers and what scores with them.

`TeacherSpec` (picklable, built once from `distillation.*`) names each teacher — a data_source value
of distillation.teachers, or `DEFAULT_TEACHER` for distillation.teacher_model_path — with its model
and scoring settings. `TeacherWorker` loads them and scores the rows it is given with the one a
call names: `teacher_log_prob`, and for a top-k loss the teacher's top-k ids and log-probs. It reads
only the trajectories' tokens (the model inputs); which rows go to which teacher is the trainer's
choice (`phases.teacher_log_prob`, by data_source).

In one process the policy's worker holds a `TeacherWorker` over its own data-parallel group (its
device, its mixed precision); with cluster.backend=ray a `RankProcess` on the plan's `teacher` pool
holds one of its own (`ray_teacher`), built by the same constructor.
"""

from __future__ import annotations

from pathlib import Path

from stratarl.cluster.specs import DEFAULT_TEACHER, TeacherSpec
from stratarl.engine.actor import Reference
from stratarl.engine.data_parallel import DataParallel
from stratarl.engine.hf_models import load_causal_lm
from stratarl.engine.requests import ScoreRequest
from stratarl.transport.data_proto import DataProto


def teacher_key(name: str) -> str:
    """The setting that names the model of teacher `name`."""
    return "distillation.teacher_model_path" if name == DEFAULT_TEACHER else f"distillation.teachers.{name}"


class TeacherWorker:
    """The frozen teachers of `spec`, loaded in the process that builds this; `dp`: the process's
    data-parallel group (the policy's in one process; none on a teacher pool of its own)."""

    def __init__(self, spec: TeacherSpec, dp: DataParallel | None = None) -> None:
        dp = dp or DataParallel()
        self.spec = spec
        self.teachers: dict[str, Reference] = {}
        for name, t in spec.teachers.items():
            model = load_causal_lm(t.model)
            vocab = model.get_output_embeddings().weight.shape[0]
            if vocab != spec.vocab_size:
                raise ValueError(
                    f"{teacher_key(name)}={t.model.path}: its vocabulary has {vocab} entries, the "
                    f"student's {spec.vocab_size}; it scores the student's token ids, so both need the "
                    "same tokenizer"
                )
            self.teachers[name] = Reference(
                model,
                micro_batch_size=t.batching.micro_batch_size,
                max_tokens_per_micro_batch=t.batching.max_tokens_per_micro_batch,
                layout=t.batching.layout,
                temperature=spec.temperature,
                logit_chunk_size=t.logit_chunk_size,
                data_parallel=dp,
            )

    def compute_teacher_log_prob(self, batch: DataProto, teacher: str = DEFAULT_TEACHER) -> DataProto:
        """log π of every response token under the teacher named `teacher`, scored like the
        reference's: `teacher_log_prob` [N, T], and for a top-k loss the teacher's k most likely
        tokens at each position, `teacher_top_k_ids` and `teacher_top_k_log_probs` [N, T, k]."""
        if teacher not in self.teachers:
            raise KeyError(f"no teacher {teacher!r}; this worker holds {sorted(self.teachers)}")
        request = ScoreRequest(top_k=self.spec.teachers[teacher].top_k)
        out = self.teachers[teacher].score_responses(batch, request)
        return DataProto.from_dict({f"teacher_{name}": column for name, column in out.items()})

    def arm_stack_dumps(self, folder: str | Path) -> list[str]:
        """Nothing to arm: in one process the worker is this process, whose stacks the watchdog dumps."""
        return []

    def dump_stacks(self, folder: str | Path, header: str) -> list[str]:
        return []
