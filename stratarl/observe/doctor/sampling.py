"""Cross-cutting: the doctor's checks of what reaches the sampler — the EOS the rollout stops on,
sampling too cold to tell a group's samples apart, prompts the data layer dropped before training.

The rollout stops a response on the tokenizer's EOS id (plus the request's stop_token_ids, which the
trace's `sampling` column records). The run directory does not record the EOS id itself, so the
EOS check reads the model directory that config.yaml names (model.tokenizer_path or model.path):
tokenizer_config.json (eos_token), tokenizer.json (the ids of its added tokens), config.json and
generation_config.json (the model's eos_token_id), and the chat template (the token after a
message's content: what ends a turn). If that directory changed since the run, so does the answer.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from stratarl.observe.doctor.checks import _had, _late, _mean, _steps
from stratarl.observe.doctor.reward import val_series
from stratarl.observe.doctor.view import CONFIG, Finding, RunView

CAPPED_FROM_START = 0.9  # share of responses at the length cap, on the first step and after
RETOKENIZED = 0.1  # share of the model's own tokens another tokenizer maps elsewhere
ENDED_INSIDE = 0.5  # share of capped traced responses that hold an end-of-turn token before the cap
COLD_TEMPERATURE = 0.3  # rollout.temperature at or below: samples of a prompt (nearly) coincide
IDENTICAL_GROUPS = 0.5  # share of traced groups whose n responses are token-for-token the same
SOLVED, MEMORIZED_GAP = 0.9, 0.3  # training reward at or above; held-out accuracy this much below it
DROPPED_PROBLEM, DROPPED_WARNING = 0.5, 0.1  # share of the prompts the data layer dropped


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    return {v for v in value if isinstance(v, int)} if isinstance(value, list) else set()


def model_eos(view: RunView) -> dict[str, Any] | None:
    """What the model directory says ends a response: {tokenizer_eos, model_eos, end_of_turn,
    names}; None when config.yaml names no readable directory."""
    model = view.setting("model.path")
    tok_dir = Path(view.setting("model.tokenizer_path") or model or "")
    if not model or not (tok_dir / "tokenizer_config.json").is_file():
        return None
    tok_config = _json(tok_dir / "tokenizer_config.json")
    added = {t["content"]: t["id"] for t in _json(tok_dir / "tokenizer.json").get("added_tokens", [])}
    eos = tok_config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    template = tok_config.get("chat_template") or ""
    if not template and (tok_dir / "chat_template.jinja").is_file():
        template = (tok_dir / "chat_template.jinja").read_text(encoding="utf-8")
    end_of_turn = None
    for match in re.finditer(r"content", str(template)):  # the first added token after a message's content
        after = str(template)[match.end() : match.end() + 60]
        found = sorted((after.find(t), t) for t in added if t in after)
        if found:
            end_of_turn = found[0][1]
            break
    model_ids = _ids(_json(Path(model) / "config.json").get("eos_token_id"))
    model_ids |= _ids(_json(Path(model) / "generation_config.json").get("eos_token_id"))
    names = {i: t for t, i in added.items()}
    return {
        "tokenizer_eos": added.get(eos) if isinstance(eos, str) else None,
        "tokenizer_eos_text": eos,
        "model_eos": model_ids,
        "end_of_turn": added.get(end_of_turn) if end_of_turn else None,
        "end_of_turn_text": end_of_turn,
        "names": names,
    }


def check_eos(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """Every response runs to the cap from step 1 because the rollout does not stop where the model
    ends its turn: the tokenizer's EOS (the rollout's stop id) is not the chat template's end-of-turn
    token or the model's eos_token_id. Told apart from 'answers need more room' by the capped
    responses themselves: they hold the end-of-turn token before the cap (the model did stop)."""
    clip = view.series("response_length/clip_ratio")
    if not clip or clip[0][1] < CAPPED_FROM_START or _mean(_late(clip)) < CAPPED_FROM_START:
        return []
    eos = model_eos(view)
    if not eos or eos["tokenizer_eos"] is None:
        return []  # the rollout's stop id is unknown: the truncation check speaks
    rows = [r for r in view.trace_rows() if r.get("finish_reason") == "length" and r.get("response_ids")]
    stop_ids = {eos["tokenizer_eos"]}
    for row in rows[:1]:
        stop_ids |= _ids(json.loads(row.get("sampling") or "{}").get("stop_token_ids", []))
    turn_unstopped = eos["end_of_turn"] is not None and eos["end_of_turn"] not in stop_ids
    ends = ({eos["end_of_turn"]} if eos["end_of_turn"] is not None else set()) | eos["model_eos"]
    ends -= stop_ids
    inside = [r for r in rows if ends & set(list(r["response_ids"])[:-1])]
    ended_inside = bool(rows) and len(inside) / len(rows) >= ENDED_INSIDE
    if not ends or not (turn_unstopped or ended_inside):
        return []  # only the model's eos id differs, and the responses do not show it: not the cause
    name = eos["names"]
    extra = sorted(stop_ids - {eos["tokenizer_eos"]})
    evidence = [
        f"response_length/clip_ratio {clip[0][1]:.0%} at step {clip[0][0]} (before any update) and "
        f"{_mean(_late(clip)):.0%} over the later half",
        f"the rollout stops on the tokenizer's EOS {eos['tokenizer_eos_text']!r} (id {eos['tokenizer_eos']})"
        + (f" and stop_token_ids {extra}" if extra else "")
        + f"; the chat template ends a turn with {eos['end_of_turn_text']!r} (id {eos['end_of_turn']}); "
        f"the model's eos_token_id: {sorted(eos['model_eos']) or 'none'}",
    ]
    if rows:
        example = (inside or rows)[-1]
        evidence.append(
            f"{len(inside)} of {len(rows)} capped traced responses hold "
            f"{sorted(name.get(i, i) for i in ends)} "
            f"before the cap (the model ended its turn; the rollout went on), e.g. trajectory "
            f"{example.get('trajectory_id')}: {str(example.get('response_text'))[:80]!r}"
        )
    target = eos["end_of_turn"] if turn_unstopped else min(ends)
    return [
        Finding(
            "problem",
            CONFIG,
            "end of sequence misconfigured: the rollout does not stop where the model ends its turn, so "
            "every response runs to the length cap",
            evidence,
            f"set the tokenizer's eos_token to {name.get(target, target)!r} (id {target}) in "
            f"{view.setting('model.tokenizer_path') or view.setting('model.path')}/tokenizer_config.json "
            "(or make the model's eos_token_id and the tokenizer's agree); raising "
            "rollout.max_response_tokens would not help",
            key="eos",
        )
    ]


def tokenizer_vocab(tok_dir: Path) -> dict[str, int]:
    """token → id over what tokenizer.json defines (its vocabulary and its added tokens)."""
    data = _json(tok_dir / "tokenizer.json")
    vocab = (data.get("model") or {}).get("vocab")
    tokens = dict(vocab) if isinstance(vocab, dict) else {}
    tokens |= {t["content"]: t["id"] for t in data.get("added_tokens", []) if isinstance(t.get("id"), int)}
    return tokens


def tokenizer_size(tok_dir: Path) -> int | None:
    """1 + the largest id tokenizer.json defines."""
    ids = tokenizer_vocab(tok_dir).values()
    return max(ids) + 1 if ids else None


def check_tokenizer_mismatch(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """A tokenizer that does not belong to the model: it defines ids the model has no embedding
    for, the model's eos id is no token of it, or the model's directory ships its own tokenizer and
    the two map tokens to different ids. (The run may still go: ids inside both ranges mean
    different words to each, so responses are noise and the reward stays 0.)"""
    model, tok_path = view.setting("model.path"), view.setting("model.tokenizer_path")
    if not model or not tok_path or Path(tok_path).resolve() == Path(model).resolve():
        return []  # one directory holds both: they were saved together
    size = tokenizer_size(Path(tok_path))
    vocab = _json(Path(model) / "config.json").get("vocab_size")
    eos = _ids(_json(Path(model) / "config.json").get("eos_token_id"))
    if size is None or not isinstance(vocab, int):
        return []
    problems = []
    if size > vocab:
        problems.append(
            f"the tokenizer defines {size} ids, the model embeds {vocab} (config.json vocab_size)"
        )
    if eos and max(eos) >= size:
        problems.append(f"the model's eos_token_id {sorted(eos)} is outside the tokenizer's {size} ids")
    own, used = tokenizer_vocab(Path(model)), tokenizer_vocab(Path(tok_path))
    if own:
        moved = sum(used.get(token) != i for token, i in own.items())
        if moved / len(own) >= RETOKENIZED:
            problems.append(
                f"{model}/tokenizer.json, the model's own tokenizer, maps {moved} of its {len(own)} "
                "tokens to other ids (or lacks them) in the tokenizer the run used"
            )
    if not problems:
        return []
    return [
        Finding(
            "problem",
            CONFIG,
            "the tokenizer does not belong to the model",
            [*problems, f"model.path = {model}, model.tokenizer_path = {tok_path}"],
            "use the tokenizer saved with the model (model.tokenizer_path empty: the model's own directory), "
            "or the one it was trained with",
            key="tokenizer_mismatch",
        )
    ]


def identical_groups(view: RunView) -> tuple[int, int, str | None]:
    """(groups whose traced responses are all the same, groups with ≥ 2 traced responses, an example
    uid) over every traced step."""
    same = total = 0
    example = None
    for rows in view.traces.values():
        groups: dict[str, list] = defaultdict(list)
        for row in rows:
            if row.get("uid") is not None and row.get("response_ids") is not None:
                groups[row["uid"]].append(tuple(row["response_ids"]))
        for uid, responses in groups.items():
            if len(responses) >= 2:
                total += 1
                if len(set(responses)) == 1:
                    same, example = same + 1, uid
    return same, total, example


def check_cold_sampling(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """A temperature near 0 makes the n samples of a prompt (nearly) the same, so their rewards are
    equal and group-relative advantages vanish. Told apart from prompts too easy or too hard by the
    responses: here they are identical, there they differ and score alike."""
    temperature = view.setting("rollout.temperature")
    same, total, example = identical_groups(view)
    share = same / total if total else 0.0
    cold = isinstance(temperature, int | float) and temperature <= COLD_TEMPERATURE
    if not cold and share < IDENTICAL_GROUPS:
        return []
    if not cold and (_had(earlier, "policy_broken") or _had(earlier, "negative_entropy_bonus")):
        return []  # a collapsed policy samples one response at any temperature: that finding says why
    if not cold and (solved := _solved_training_prompts(view, share)):
        return solved
    evidence = [f"rollout.temperature = {temperature}"]
    if total:
        evidence.append(
            f"{same} of {total} traced groups have n token-for-token identical responses"
            + (f", e.g. group {example} (`stratarl trace RUN --uid {example}`)" if example else "")
        )
    signal = view.series("batch/groups_with_signal")
    if signal:
        evidence.append(
            f"batch/groups_with_signal mean {_mean([v for _, v in signal]):.0%} ({_steps(signal)})"
        )
    evidence.append(
        "prompts that are too easy or too hard give differing responses with equal rewards; "
        "identical responses point at the sampler"
    )
    return [
        Finding(
            "problem" if share >= IDENTICAL_GROUPS or (cold and not total) else "warning",
            CONFIG,
            f"sampling too cold: {share:.0%} of groups sample the same response n times"
            if total
            else f"sampling too cold: rollout.temperature = {temperature}",
            evidence,
            f"raise rollout.temperature (now {temperature}) to 1.0, the policy's own distribution (the "
            "recipes use 0.6–1.0), and check rollout.top_k / rollout.top_p do not leave one token"
            if cold
            else f"rollout.temperature is {temperature}, yet the samples coincide: rollout.top_k / "
            "rollout.top_p leave one token, or the policy became deterministic (actor/entropy)",
            key="cold_sampling",
        )
    ]


def _solved_training_prompts(view: RunView, share: float) -> list[Finding]:
    """Identical samples on training prompts the policy already answers right (training reward at or
    above SOLVED): its groups carry no signal at any temperature, so the sampler is not the cause.
    With held-out accuracy far below, the model has memorized its training prompts (SFT on the same
    rows) rather than learned the task; otherwise the task is solved."""
    train = _late(view.series("reward/acc/mean") or view.series("score/mean"))
    key, held_out = val_series(view)
    if not train or not held_out or _mean(train) < SOLVED:
        return []
    late_val = _mean(_late(held_out))
    memorized = late_val <= _mean(train) - MEMORIZED_GAP
    evidence = [
        f"{share:.0%} of traced groups sample one response n times; training reward {_mean(train):.2f} "
        f"(later half), held-out {key} {late_val:.2f}",
    ]
    signal = view.series("batch/groups_with_signal")
    if signal:
        evidence.append(
            f"batch/groups_with_signal mean {_mean([v for _, v in signal]):.0%} ({_steps(signal)})"
        )
    if not memorized:
        return [
            Finding(
                "warning", CONFIG, "the training prompts are solved: few groups left to learn from",
                evidence,
                "GRPO learns only where a prompt's samples differ: harder prompts give it room, or "
                "the run is done",
                key="solved_prompts",
            )
        ]  # fmt: skip
    return [
        Finding(
            "problem", CONFIG, "the training prompts are memorized: solved in training, not held out",
            evidence,
            "GRPO learns only where a prompt's samples differ, and the training prompts are already "
            "answered: give more distinct training prompts than SFT can memorize, fewer SFT steps, "
            "or a model that generalizes better (--size, a pretrained model)",
            key="memorized_prompts",
        )
    ]  # fmt: skip


def _largest(view: RunView, key: str) -> float | None:
    values = [r[key] for r in view.records if isinstance(r.get(key), int | float)]
    return max(values) if values else None


def check_prompts_dropped(view: RunView, earlier: list[Finding]) -> list[Finding]:
    """The data layer dropped prompts before training (over data.max_prompt_tokens, by the overlong
    filter): `data/prompts_dropped` and `data/prompts_kept` are counts, `data/longest_prompt_tokens`
    the longest prompt seen."""
    dropped, kept = _largest(view, "data/prompts_dropped"), _largest(view, "data/prompts_kept")
    if not dropped or kept is None:
        return []
    share = dropped / (dropped + kept)
    if share < DROPPED_WARNING:
        return []
    longest, cap = _largest(view, "data/longest_prompt_tokens"), view.setting("data.max_prompt_tokens")
    evidence = [f"data/prompts_dropped {int(dropped)}, data/prompts_kept {int(kept)}: {share:.0%} dropped"]
    if longest is not None:
        evidence.append(f"data/longest_prompt_tokens {int(longest)} against data.max_prompt_tokens = {cap}")
    return [
        Finding(
            "problem" if share >= DROPPED_PROBLEM else "warning",
            CONFIG,
            f"{share:.0%} of the prompts were dropped before training: longer than data.max_prompt_tokens",
            evidence,
            f"raise data.max_prompt_tokens (now {cap}"
            + (f"; the longest prompt has {int(longest)} tokens" if longest is not None else "")
            + ") within the model's context, or shorten the prompts; the kept ones may not be the task",
            key="prompts_dropped",
        )
    ]
