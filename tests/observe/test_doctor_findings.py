"""Each failure class of issue 30 planted in a run directory written as the trainer writes one
(config.yaml, metrics.jsonl with its validation lines, traces/ through `TraceWriter`, run.lock and
run.json, the model directory config.yaml names): the doctor names the cause, in its layer, with a
next step that fits it, defers the symptoms to it, and says nothing alarming on healthy GRPO, PPO
and async records."""

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from stratarl.observe.doctor.collapse import repeated_share
from stratarl.observe.doctor.diagnosis import diagnose, run_status
from stratarl.observe.doctor.view import load_run
from stratarl.observe.trace_store import StepTrace, TraceWriter
from stratarl.run_directory.lock import RunLock

STEPS, GROUPS, N = 10, 8, 4
END, TOKENS = 2, {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|pad|>": 3}


def config(**sections):
    base = {
        "data": {"prompts_per_step": GROUPS, "max_prompt_tokens": 64},
        "model": {"path": "", "dtype": "float32"},
        "rollout": {"n": N, "max_response_tokens": 16, "temperature": 1.0, "dtype": None},
        "actor": {"prompts_per_mini_batch": GROUPS, "lr": 1e-4, "entropy_coeff": 0.0, "kl_loss_coef": 0.001},
        "critic": {"lr": 1e-5},
        "trainer": {"total_steps": STEPS, "save_freq": 0, "resume_mode": "auto", "mode": "sync"},
        "async_training": {"max_staleness": 1},
    }
    for name, values in sections.items():
        base[name] = base.get(name, {}) | values
    return base


def healthy_step(step):
    """One step of a GRPO run that learns: reward and accuracy rise, entropy eases, nothing truncated."""
    return {
        "step": step, "phase": "train", "critic/score/mean": 0.3 + 0.03 * step, "critic/score/min": 0.0,
        "critic/score/max": 1.0, "critic/advantages/max": 1.2, "critic/advantages/min": -1.1,
        "batch/groups_with_signal": 0.6, "response_length/clip_ratio": 0.02, "response_length/mean": 5.0,
        "actor/lr": 1e-4, "actor/grad_norm": 0.5, "actor/entropy": 0.45 - 0.01 * step, "actor/pg_loss": 0.01,
        "reward/acc/mean": 0.3 + 0.03 * step, "reward/format_ok/mean": 0.9,
        "rollout/weight_version": float(step), "rollout/staleness/max": 0.0, "rollout_corr/kl": 1e-7,
        "reward/failures/total": 0.0, "perf/cpu_memory_used_gb": 1.0, "timing_s/step": 1.0,
        "timing_s/gen": 0.5, "timing_s/update_actor": 0.4, "memory/host_peak_gb": 1.0,
        "memory/host_total_gb": 16.0, "memory/host_peak_gb/gen": 1.0,
    }  # fmt: skip


def answer_ids(answer):
    """'Answer: <n><|im_end|>' as ids: the prompt's answer digit by digit, then the end of turn."""
    return [278, 29, 224, *(20 + int(d) for d in str(answer)), END]


def healthy_rows(step):
    """Eight groups of four: two samples right, two wrong (answers differ per prompt)."""
    rows = []
    for g in range(GROUPS):
        truth = 3 * g + step
        for i in range(N):
            answer = truth if i < 2 else truth + 1 + i
            rows.append({
                "uid": f"{step}.1-{g}", "response_ids": answer_ids(answer),
                "response_text": f"Answer: {answer}<|im_end|>", "ground_truth": json.dumps(str(truth)),
                "reward": 1.0 if i < 2 else 0.0, "finish_reason": "stop", "advantage": 0.8 if i < 2 else -0.8,
                "sampling": json.dumps({"temperature": 1.0, "stop_token_ids": []}),
                "tool_errors": 0, "tool_calls": 0,
            })  # fmt: skip
    return rows


def write_run(
    path, *, cfg=None, change=None, rows=None, val=(0.3, 0.4, 0.5), finished=True, lock=None, extra=()
):
    """A run directory as the trainer leaves it. change(step) -> metrics to replace; rows(step) ->
    trace rows (None: the healthy ones); val: the held-out accuracy at steps 1, 5, 10."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg or config()))
    records = [healthy_step(s) | (change(s) if change else {}) for s in range(1, STEPS + 1)]
    for step, value in zip((1, 5, 10), val, strict=False):
        records.append({"step": step, "phase": "val", "val-core/arithmetic/acc/mean@1": value})
    records += list(extra)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    writer = TraceWriter(path)
    for step in range(1, STEPS + 1):
        trace = StepTrace(step)
        step_rows = (rows or healthy_rows)(step)
        ids = [f"{r['uid']}/{i % N}" for i, r in enumerate(step_rows)]
        trace.add(ids, {key: [r[key] for r in step_rows] for key in step_rows[0]})
        writer.write(trace)
    (path / "run.json").write_text(json.dumps({"status": "finished" if finished else "running"}))
    (path / "run.lock").write_text(json.dumps(lock) if lock else "")  # released: empty
    if finished:
        (path / "final").mkdir()
    return path


def findings(path):
    return {f.key: f for f in diagnose(load_run(path))}


def alarming(path):
    return {f.key: f.title for f in diagnose(load_run(path)) if f.severity != "info"}


def test_healthy_grpo_ppo_and_async_records_raise_nothing(tmp_path):
    assert alarming(write_run(tmp_path / "grpo")) == {}
    ppo = {"critic/vf_explained_var": None, "critic/vf_loss": None}
    ppo_run = write_run(
        tmp_path / "ppo",
        change=lambda s: ppo | {"critic/vf_explained_var": -0.5 + 0.12 * s, "critic/vf_loss": 1.0 / s},
    )
    assert alarming(ppo_run) == {}
    asynchronous = config(trainer={"mode": "async"}, async_training={"max_staleness": 2})
    async_run = write_run(
        tmp_path / "async",
        cfg=asynchronous,
        change=lambda s: {"rollout/staleness/max": float(s % 3), "rollout_corr/kl": 0.02},
    )
    assert alarming(async_run) == {}  # staleness within the bound; π_old drifts from π_rollout by design


# --- the update breaks the policy ----------------------------------------------------------------
def garbage_rows(step):
    """After step 3 every response repeats one token to the cap."""
    rows = healthy_rows(step)
    if step > 3:
        for row in rows:
            row |= {"response_ids": [77] * 16, "response_text": "!" * 16, "reward": 0.0,
                    "finish_reason": "length"}  # fmt: skip
    return rows


def broken(step):
    """actor.lr=1e-2: reward 0.4 on steps 1-2, then 0; entropy 0.4 → 3; responses run to the cap."""
    early = step <= 2
    return {
        "critic/score/mean": 0.4 if early else 0.0, "reward/acc/mean": 0.4 if early else 0.0,
        "actor/entropy": 0.4 if early else 3.0, "response_length/clip_ratio": 0.02 if early else 1.0,
        "batch/groups_with_signal": 0.6 if early else 0.0,
        "critic/advantages/max": 1.2 if early else 0.0, "critic/advantages/min": -1.1 if early else 0.0,
        "actor/grad_norm": 0.5 if early else 40.0,
    }  # fmt: skip


def solved(step):
    """A solved task (sort_numbers after SFT): reward 1, a nearly deterministic policy whose tiny
    entropy doubles (0.003 → 0.007) and whose tiny gradient norm jumps: noise, not a broken update."""
    return {
        "critic/score/mean": 1.0, "reward/acc/mean": 1.0, "actor/entropy": 0.003 if step <= 2 else 0.007,
        "actor/grad_norm": 0.001 if step <= 2 else 0.05, "batch/groups_with_signal": 0.08,
    }  # fmt: skip


def test_a_tiny_entropy_that_doubles_on_a_solved_task_is_not_a_broken_update(tmp_path):
    found = findings(write_run(tmp_path / "run", change=solved, rows=garbage_rows))
    assert "policy_broken" not in found


def test_a_learning_rate_too_high_is_named_before_truncation_and_missing_signal(tmp_path):
    run = write_run(
        tmp_path / "run", cfg=config(actor={"lr": 1e-2}), change=broken, rows=garbage_rows, val=(0.4, 0, 0)
    )
    found = findings(run)
    problem = found["policy_broken"]
    assert problem.severity == "problem" and problem.layer == "config"
    assert "learning rate too high" in problem.title and "actor.lr" in problem.next_step
    evidence = " ".join(problem.evidence)
    assert "actor/entropy rose" in evidence and "actor/grad_norm 0.5 at step 1, 40 at step 3" in evidence
    assert "repeat themselves, e.g. trajectory 10.1-" in evidence  # a trajectory to trace
    assert not {"truncation", "no_signal", "weak_signal", "repetition"} & set(found)


def ended_at_once(step):
    """actor.lr=3e-2 on an EPYC (a real run's numbers): reward 0.31 at step 1, then 0; entropy spikes to
    1.42 at step 2 and falls back to 0.36; responses shrink from 5.2 tokens to about 1 (the turn ends
    at once), so no truncation, no repetition, and the groups stop differing."""
    entropy = {1: 0.30, 2: 1.42, 3: 0.86, 4: 0.64}.get(step, 0.36)
    return {
        "critic/score/mean": 0.31 if step == 1 else 0.0, "reward/acc/mean": 0.31 if step == 1 else 0.0,
        "actor/entropy": entropy, "response_length/mean": 5.2 if step == 1 else 1.1,
        "batch/groups_with_signal": 0.5 if step == 1 else 0.0, "actor/grad_norm": 0.5 if step == 1 else 0.0,
        "critic/advantages/max": 1.2 if step == 1 else 0.0,
        "critic/advantages/min": -1.1 if step == 1 else 0.0,
    }  # fmt: skip


def test_a_learning_rate_too_high_whose_responses_end_at_once_is_named(tmp_path):
    found = findings(write_run(tmp_path / "run", cfg=config(actor={"lr": 3e-2}), change=ended_at_once))
    problem = found["policy_broken"]
    evidence = " ".join(problem.evidence)
    assert "actor/entropy spiked 4.7× at step 2" in evidence and "ends its turn at once" in evidence
    assert problem.layer == "config" and "actor.lr" in problem.next_step
    assert not {"no_signal", "weak_signal"} & set(found), list(found)


def test_a_negative_entropy_bonus_is_config_and_explains_the_collapse(tmp_path):
    def collapse(step):
        return {"actor/entropy": 0.4 * 0.5**step, "batch/groups_with_signal": max(0.0, 0.6 - 0.1 * step)}

    run = write_run(tmp_path / "run", cfg=config(actor={"entropy_coeff": -0.01}), change=collapse)
    found = findings(run)
    problem = found["negative_entropy_bonus"]
    assert problem.severity == "problem" and problem.layer == "config"
    assert "actor.entropy_coeff ≥ 0" in problem.next_step and "falls here" in " ".join(problem.evidence)
    assert not {"entropy", "weak_signal", "policy_broken"} & set(found)


# --- the reward ----------------------------------------------------------------------------------
def inverted_rows(step):
    """The scorer pays for wrong answers: reward 1 on the two wrong samples, 0 on the right ones."""
    rows = healthy_rows(step)
    for row in rows:
        row["reward"] = 1.0 - row["reward"]
    return rows


def test_a_reward_with_the_wrong_sign_is_named_from_the_traces_and_validation(tmp_path):
    run = write_run(
        tmp_path / "run",
        change=lambda s: {"critic/score/mean": 0.1 * s, "reward/acc/mean": 0.1 * s},
        rows=inverted_rows,
        val=(0.5, 0.3, 0.1),
    )
    problem = findings(run)["reward_sign"]
    assert problem.severity == "problem" and problem.layer == "compute & environment"
    assert "sign" in problem.title and "reference answers" in problem.next_step
    evidence = " ".join(problem.evidence)
    assert "val-core/arithmetic/acc/mean@1: step 1 0.5, step 5 0.3, step 10 0.1" in evidence
    assert "the ground truth is in 100% of 80 low-reward responses and 0% of 80 high-reward" in evidence


def test_reward_hacked_by_length_is_not_mistaken_for_a_wrong_sign(tmp_path):
    run = write_run(
        tmp_path / "run",
        change=lambda s: {"response_length/mean": 5.0 * s, "critic/score/mean": 0.1 * s},
        val=(0.5, 0.4, 0.3),
    )
    found = findings(run)
    assert found["length_hacking"].layer == "compute & environment"
    assert "reward_sign" not in found  # the responses' growth tells them apart


def shortcut_rows(step):
    rows = healthy_rows(step)
    for row in rows:
        row |= {"response_ids": answer_ids(7), "response_text": "Answer: 7<|im_end|>"}
    return rows


def test_the_same_answer_whatever_the_prompt_is_a_shortcut(tmp_path):
    problem = findings(write_run(tmp_path / "run", rows=shortcut_rows, val=(0.2, 0.2, 0.2)))["shortcut"]
    assert problem.layer == "compute & environment" and "'7'" in problem.title
    assert "label balance" in problem.next_step


def test_a_format_reward_that_saturates_explains_a_flat_validation(tmp_path):
    flat = {"reward/format_ok/mean": 1.0, "reward/acc/mean": 0.2, "critic/score/mean": 0.6}
    found = findings(write_run(tmp_path / "run", change=lambda s: flat, val=(0.2, 0.2, 0.21)))
    assert found["format_saturated"].layer == "compute & environment"
    assert "flat_validation" not in found


def test_a_format_learned_in_sft_is_not_flagged_on_a_short_run_that_validated_once(tmp_path):
    """The doctor's real healthy run (tests/trainer/test_doctor_runs.py) on an Intel Xeon: format 96 %
    from step 1, accuracy 0.38 over 8 steps, one validation: nothing says the run is stuck."""
    learned = {"reward/format_ok/mean": 0.96, "reward/acc/mean": 0.38}
    run = write_run(
        tmp_path / "run", cfg=config(trainer={"total_steps": 8}), change=lambda s: learned, val=(0.4,)
    )
    assert "format_saturated" not in findings(run)


def test_a_flat_validation_while_the_training_reward_rises(tmp_path):
    warning = findings(write_run(tmp_path / "run", val=(0.2, 0.2, 0.21)))["flat_validation"]
    assert warning.severity == "warning" and "training reward rises without it" in warning.title
    assert warning.evidence[0] == "val-core/arithmetic/acc/mean@1: step 1 0.2, step 5 0.2, step 10 0.21"


# --- what reaches the sampler --------------------------------------------------------------------
def model_dir(path, *, eos="<|im_end|>", model_eos=END):
    """A model directory as save_pretrained leaves it: tokenizer files, chat template, config."""
    path.mkdir()
    added = [{"id": i, "content": t, "special": True} for t, i in TOKENS.items()]
    (path / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "pad_token": "<|pad|>"}))
    template = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    template += "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    (path / "chat_template.jinja").write_text(template)
    (path / "config.json").write_text(json.dumps({"eos_token_id": model_eos}))
    return path


def run_on_rows(step):
    """The model ends its turn (id 2) after the answer, the rollout goes on to the cap."""
    rows = healthy_rows(step)
    for row in rows:
        row |= {"response_ids": row["response_ids"] + [1] * 10, "finish_reason": "length"}
    return rows


def test_an_eos_that_is_not_the_end_of_turn_is_named_not_the_cap(tmp_path):
    model = model_dir(tmp_path / "model", eos="<|endoftext|>")
    capped = {"response_length/clip_ratio": 1.0, "response_length/mean": 16.0}
    run = write_run(
        tmp_path / "run", cfg=config(model={"path": str(model)}), change=lambda s: capped, rows=run_on_rows
    )
    found = findings(run)
    problem = found["eos"]
    assert problem.severity == "problem" and problem.layer == "config"
    assert "'<|im_end|>' (id 2)" in problem.next_step and "would not help" in problem.next_step
    assert "'<|endoftext|>' (id 0)" in " ".join(problem.evidence)
    assert "truncation" not in found
    healthy_model = model_dir(tmp_path / "good")  # the same cap with a right EOS: answers need room
    run = write_run(
        tmp_path / "short", cfg=config(model={"path": str(healthy_model)}), change=lambda s: capped
    )
    assert "eos" not in findings(run) and findings(run)["truncation"].layer == "config"


def test_a_tokenizer_that_does_not_belong_to_the_model(tmp_path):
    model = model_dir(tmp_path / "model", model_eos=32001)
    (model / "config.json").write_text(json.dumps({"eos_token_id": 32001, "vocab_size": 32002}))
    other = tmp_path / "other"
    other.mkdir()
    vocab = {f"t{i}": i for i in range(40000)}
    (other / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    zero = {"critic/score/min": 0.0, "critic/score/max": 0.0, "critic/score/mean": 0.0}
    cfg = config(model={"path": str(model), "tokenizer_path": str(other)})
    found = findings(write_run(tmp_path / "run", cfg=cfg, change=lambda s: zero))
    problem = found["tokenizer_mismatch"]
    assert problem.layer == "config" and "defines 40000 ids, the model embeds 32002" in problem.evidence[0]
    assert "reward_constant" not in found  # the cause, not "reward always 0"
    own = config(model={"path": str(model), "tokenizer_path": str(model)})
    assert "tokenizer_mismatch" not in findings(write_run(tmp_path / "own", cfg=own))


def test_a_tokenizer_of_the_same_size_but_another_vocabulary_is_named(tmp_path):
    # Trained on another corpus: every id is inside the model's embedding, but the ids mean other
    # words. The model's own directory ships the tokenizer it was trained with; the two disagree.
    def tokenizer(path, words):
        path.mkdir(exist_ok=True)
        vocab = {w: i for i, w in enumerate(words)}
        (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
        return path

    model = tokenizer(tmp_path / "model", [f"digit{i}" for i in range(100)])
    (model / "config.json").write_text(json.dumps({"eos_token_id": 1, "vocab_size": 100}))
    other = tokenizer(tmp_path / "other", [f"word{i}" for i in range(100)])
    found = findings(
        write_run(tmp_path / "run", cfg=config(model={"path": str(model), "tokenizer_path": str(other)}))
    )
    problem = found["tokenizer_mismatch"]
    assert "maps 100 of its 100 tokens to other ids" in problem.evidence[0], problem.evidence
    same = tokenizer(tmp_path / "copy", [f"digit{i}" for i in range(100)])  # a copy of the model's own
    cfg = config(model={"path": str(model), "tokenizer_path": str(same)})
    assert "tokenizer_mismatch" not in findings(write_run(tmp_path / "run2", cfg=cfg))


def identical_rows(step):
    rows = healthy_rows(step)
    for row in rows:
        first = rows[(rows.index(row) // N) * N]
        row |= {"response_ids": first["response_ids"], "response_text": first["response_text"], "reward": 1.0}
    return rows


def test_sampling_too_cold_is_told_apart_from_prompts_too_hard(tmp_path):
    no_signal = {"batch/groups_with_signal": 0.02}
    cold = write_run(
        tmp_path / "cold",
        cfg=config(rollout={"temperature": 0.05}),
        change=lambda s: no_signal,
        rows=identical_rows,
    )
    found = findings(cold)
    problem = found["cold_sampling"]
    assert problem.severity == "problem" and problem.layer == "config"
    assert "rollout.temperature" in problem.next_step and "100% of groups" in problem.title
    assert "weak_signal" not in found
    hard = findings(write_run(tmp_path / "hard", change=lambda s: no_signal))
    assert "cold_sampling" not in hard and hard["weak_signal"].layer == "compute & environment"
    assert "too easy or too hard" in hard["weak_signal"].next_step


def test_identical_samples_on_solved_training_prompts_are_no_cold_sampler(tmp_path):
    """Was: SFT'd to 98 % on its 2,000 training prompts and 33 % held out (examples/first_letter), GRPO
    sampled one response per group at τ = 1 and the doctor blamed the sampler (top_k / top_p)."""
    solved = {"batch/groups_with_signal": 0.17, "reward/acc/mean": 0.98}
    memorized = findings(
        write_run(
            tmp_path / "memorized", change=lambda s: solved, rows=identical_rows, val=(0.32, 0.33, 0.33)
        )
    )
    problem = memorized["memorized_prompts"]
    assert problem.severity == "problem" and "cold_sampling" not in memorized
    assert "training reward 0.98" in problem.evidence[0] and "acc/mean@1 0.33" in problem.evidence[0]
    generalized = findings(
        write_run(tmp_path / "solved", change=lambda s: solved, rows=identical_rows, val=(0.9, 0.95, 0.97))
    )
    assert "memorized_prompts" not in generalized and "cold_sampling" not in generalized
    assert generalized["solved_prompts"].severity == "warning"  # solved, held out too: nothing left
    cold = findings(write_run(tmp_path / "cold", rows=identical_rows))  # reward/acc/mean unsolved
    assert "cold_sampling" in cold and "solved_prompts" not in cold


def test_group_signal_is_judged_per_step_and_advantages_need_not_be_exactly_zero(tmp_path):
    every_third = write_run(
        tmp_path / "steps",
        change=lambda s: {"batch/groups_with_signal": 0.06 if s % 3 == 0 or s < 3 else 0.6},
    )
    weak = findings(every_third)["weak_signal"]  # the run's mean is 0.38, above the 10 % line
    assert "on 5 of 10 steps" in weak.title
    tiny = {"critic/advantages/max": 3e-8, "critic/advantages/min": -2e-8, "batch/groups_with_signal": 0.0}
    assert findings(write_run(tmp_path / "tiny", change=lambda s: tiny))["no_signal"].severity == "problem"


def test_prompts_dropped_before_training(tmp_path):
    counts = {"step": 0, "phase": "data", "data/prompts_dropped": 75, "data/prompts_kept": 25}
    run = write_run(tmp_path / "run", extra=[counts | {"data/longest_prompt_tokens": 300}])
    problem = findings(run)["prompts_dropped"]
    assert problem.severity == "problem" and problem.layer == "config"
    assert "75%" in problem.title and "longest prompt has 300 tokens" in problem.next_step


# --- log-probs, the loss's other terms, tools, memory -----------------------------------------------
def test_the_log_prob_mismatch_line_follows_the_precisions(tmp_path):
    bf16 = config(rollout={"dtype": "bfloat16"})
    gap = findings(write_run(tmp_path / "bf16", cfg=bf16, change=lambda s: {"rollout_corr/kl": 5e-4}))
    warning = gap["mismatch"]  # under the old 0.005 line, 10^3× the fp32 runs
    assert warning.severity == "warning" and warning.layer == "compute & environment"
    assert "rollout.dtype" in warning.next_step and "precision" in " ".join(warning.evidence)
    fp32 = findings(write_run(tmp_path / "fp32", change=lambda s: {"rollout_corr/kl": 2e-3}))
    assert fp32["mismatch"].severity == "problem"
    both_half = config(model={"dtype": "bfloat16"}, rollout={"dtype": "bfloat16"})
    assert "mismatch" not in findings(
        write_run(tmp_path / "half", cfg=both_half, change=lambda s: {"rollout_corr/kl": 1e-3})
    )


def test_a_kl_loss_that_outweighs_the_policy_loss(tmp_path):
    kl = {"actor/kl_loss": 0.5, "actor/kl_coef": 0.1, "actor/pg_loss": -0.01}
    warning = findings(write_run(tmp_path / "run", change=lambda s: kl))["kl_dominates"]
    assert warning.layer == "config" and "actor.kl_loss_coef" in warning.next_step
    assert "the coefficient, not the drift" in " ".join(warning.evidence)


def test_a_critic_that_does_not_learn(tmp_path):
    critic = {"critic/vf_explained_var": -0.6, "critic/vf_loss": 2.0}
    warning = findings(write_run(tmp_path / "run", change=lambda s: critic))["critic"]
    assert warning.layer == "RL math" and "critic.lr" in warning.next_step


def test_stale_async_batches_are_control_flow(tmp_path):
    asynchronous = config(trainer={"mode": "async"}, async_training={"max_staleness": 1})
    run = write_run(tmp_path / "run", cfg=asynchronous, change=lambda s: {"rollout/staleness/max": 3.0})
    problem = findings(run)["stale"]
    assert problem.layer == "control flow" and "bound 1" in problem.next_step


def test_a_tool_that_always_fails(tmp_path):
    tools = {"agent/tool_calls/total": 16.0, "agent/tool_errors/total": 16.0, "agent/failures/timeout": 16.0}
    problem = findings(write_run(tmp_path / "run", change=lambda s: tools))["tool_failures"]
    assert problem.severity == "problem" and problem.layer == "compute & environment"
    assert "timeout: 160" in " ".join(problem.evidence)


def test_memory_that_grows_every_step(tmp_path):
    run = write_run(tmp_path / "run", change=lambda s: {"perf/cpu_memory_used_gb": 1.0 + 0.3 * s})
    warning = findings(run)["memory_growth"]
    assert warning.layer == "compute & environment" and "+2.70 GiB" in warning.title


def test_repetition_without_a_broken_update(tmp_path):
    def repeating(step):
        rows = healthy_rows(step)
        for row in rows[::2]:
            row |= {"response_ids": [40, 41] * 6, "response_text": "ab" * 6}
        return rows

    warning = findings(write_run(tmp_path / "run", rows=repeating))["repetition"]
    assert "degenerate repetition" in warning.title and "trajectory 10.1-7/2" in warning.evidence[1]
    assert repeated_share([5, 5, 5, 5]) == 0.75 and repeated_share([1, 2, 3, 4, 5]) == 0.0


# --- a dead run and what a rerun may do -----------------------------------------------------------
def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_run_whose_lock_holder_died_is_dead_at_once(tmp_path, checkpoint):
    holder = {"pid": dead_pid(), "host": socket.gethostname(), "since": "2026-12-03T10:00:00+0000"}
    run = write_run(tmp_path / "run", change=None, finished=False, lock=holder)  # metrics written just now
    if checkpoint:
        (run / "checkpoints" / "global_step_4").mkdir(parents=True)
    view = load_run(run)
    assert f"dead (pid {holder['pid']}" in run_status(view)
    problem = findings(run)["progress"]
    assert problem.severity == "problem" and "is dead" in problem.title
    assert f"run.lock names pid {holder['pid']}" in problem.evidence[0]
    if checkpoint:
        assert "resumes from checkpoints/global_step_4" in problem.next_step
    else:
        assert "no checkpoint to resume from (trainer.save_freq=0)" in problem.next_step
        assert "resumes" not in problem.next_step and "trainer.overwrite=true" in problem.next_step


def test_a_run_whose_lock_holder_lives_is_live(tmp_path):
    run = write_run(tmp_path / "run", finished=False)
    old = 1_000_000_000  # metrics unwritten for years: a slow step, the holder still runs
    os.utime(run / "metrics.jsonl", (old, old))
    lock = RunLock(run).acquire()
    try:
        assert f"live (pid {os.getpid()} holds the run directory's lock)" in run_status(load_run(run))
        assert "progress" not in findings(run)
        (run / "run.lock").unlink()  # the record gone: the kernel's lock still says who writes
        assert "live (a process holds the run directory's lock)" in run_status(load_run(run))
    finally:
        lock.release()
    assert "live" not in run_status(load_run(run))


def test_a_holder_named_in_run_lock_but_not_holding_the_lock_is_dead(tmp_path):
    """Was: liveness from the pid in run.lock; a reused pid (here: this process) read as live."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": "2026-12-03T10:00:00+0000"}
    run = write_run(tmp_path / "run", finished=False, lock=holder)
    status = run_status(load_run(run))
    assert f"dead (pid {os.getpid()}, named in run.lock, no longer holds the lock)" in status


def test_an_error_in_each_package_names_its_layer(tmp_path):
    cases = {"transport/field_checks.py": "data transport", "config/validation.py": "config",
             "cluster/dispatch.py": "orchestration", "trainer/step.py": "control flow",
             "reward/manager.py": "compute & environment"}  # fmt: skip
    for i, (module, layer) in enumerate(cases.items()):
        run = write_run(tmp_path / f"run{i}", finished=False)
        folder = run / "hang" / "error-1"
        folder.mkdir(parents=True)
        frames = [
            f'File "/x/stratarl/{module}", line 9 in f',
            'File "/x/stratarl/trainer/step.py", line 1 in run',
        ]
        report = {"message": "Boom", "exception": "ValueError", "phase": "gen (step 2)", "frames": frames}
        (folder / "report.json").write_text(json.dumps(report))
        assert findings(run)["error"].layer == layer, module
