"""Layer 1, config: docs/config.md, generated from the schema declarations (never edited by hand).

    python -m stratarl.config.markdown docs/config.md

A test checks that the file in the repository equals `render_config_markdown()`.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from stratarl.config.schema_run import RunConfig
from stratarl.config.setting import SectionInfo, SettingInfo, type_name, walk_settings
from stratarl.config.verl_markdown import render_verl_section

INTRO = """\
# Configuration reference

<!-- Generated from stratarl/config/schema_*.py by `python -m stratarl.config.markdown docs/config.md`.
     Do not edit by hand: tests/config/test_docs.py fails when this file is stale. -->

A run is one `RunConfig`: the defaults below, then a recipe YAML from `recipes/` (overrides only;
`extends: other.yaml` layers it on another recipe), then dotted overrides on the command line:

    stratarl train recipes/grpo_arithmetic.yaml rollout.n=8 algorithm.adv_estimator=rloo

In Python: `cfg = load_config(recipe, overrides)`, then `warnings = validate_config(cfg)`.

**Units.** Names say what they count. B = `data.prompts_per_step` prompts per step; each is sampled
`rollout.n` times, so a step has N = B·n trajectories. `actor.prompts_per_mini_batch` counts prompts
(verl's `ppo_mini_batch_size` does too); `*_micro_batch` sizes count trajectories; `*_tokens` count
tokens. The trainer prints the batch plan at start-up: mini-batches per step = B / prompts per
mini-batch; optimizer steps per step = that × `actor.ppo_epochs`; micro-batches per mini-batch
(the gradient-accumulation steps) = prompts per mini-batch · n / trajectories per micro-batch.

**Validation** (`validate_config`) reports every problem at once, each naming its keys: unknown keys
(with the nearest valid key, or our name for a verl key) and wrong types (at load time); names not
in the `stratarl/algo/` registries (estimators, policy losses, aggregations, KL estimators and
controllers) with the valid names; batch sizes that do not divide; values out of range; an
estimator that needs a critic with `critic.enable=false`; a group estimator (grpo, rloo, ...) with
`rollout.n` < 2 — an **error**, because a group of one has no baseline; missing data files and
model directories. Runnable but doubtful settings come back as warnings, which `stratarl train`
prints (`warning: ...`) before anything loads — among them `async_training.*` keys changed from
their defaults that `trainer.mode` does not read (sync reads none of them, one_step_off only
`correction`). `stratarl sft` prints only the warnings about keys it reads (`SFT_READS` in
`stratarl/config/sft_scope.py`: `sft.*`, the model and `actor.fsdp`, the data, the rollout engine
and `rollout.val_kwargs`, the scorer, the run directory), and two of its own: an empty
`data.val_files` (no held-out accuracy before and after), and keys given on its command line that
it does not read (`actor.lr=...` where `sft.lr` was meant). RL settings in a recipe shared with
`stratarl train` are not warned about.

**Every setting here does what it says.** `tests/config/test_every_key_is_read.py` checks that
each key below is read by some module outside `stratarl/config/`, and that each listed choice is
either built (some module names it) or refused at validation with a message naming the key — a
choice this build lacks (`rollout.backend=sglang`, `vllm` without vLLM installed, `cluster.device=cuda`
without CUDA) stops the run before anything loads.

The **verl** column names the verl key a setting corresponds to, for porting verl scripts; writing
a verl key here is an error whose message gives our name for it. A verl command line runs as it is
with `stratarl verl` ([Running a verl command line](#running-a-verl-command-line), at the end).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(settings: list[SettingInfo]) -> list[str]:
    lines = ["| key | type | default | meaning | verl |", "|---|---|---|---|---|"]
    for info in settings:
        doc = info.doc + (f" (one of: {', '.join(info.choices)})" if info.choices else "")
        verl = f"`{info.verl}`" if info.verl else ""
        default = json.dumps(info.default)
        cells = [f"`{info.key}`", type_name(info.type), f"`{default}`", doc, verl]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return lines


def _section(key: str, cls: type, doc: str, level: int) -> list[str]:
    """The heading, class docstring and table of one section, then its nested sections."""
    lines = [f"{'#' * level} `{key}` — {doc}", "", inspect.getdoc(cls) or "", ""]
    children = [info for info in walk_settings(cls, f"{key}.") if info.key.rpartition(".")[0] == key]
    lines += [*_table([info for info in children if isinstance(info, SettingInfo)]), ""]
    for info in children:
        if isinstance(info, SectionInfo):
            lines += _section(info.key, info.cls, info.doc, level + 1)
    return lines


def render_config_markdown() -> str:
    """The full text of docs/config.md: every setting with its type, default, meaning and verl key."""
    lines = [INTRO]
    for info in walk_settings(RunConfig):
        if isinstance(info, SectionInfo) and "." not in info.key:
            lines += _section(info.key, info.cls, info.doc, level=2)
    lines += render_verl_section()
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    text = render_config_markdown()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
