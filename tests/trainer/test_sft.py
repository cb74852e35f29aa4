"""SFT: examples are prompt ++ reference answer ++ EOS in the RL layout, and the NLL goes down."""

import pytest
import torch

from stratarl.apps.quickstart import RECIPE
from stratarl.assembly import datasets
from stratarl.config import load_config
from stratarl.observe.run_log import RunLog
from stratarl.trainer.sft import run_sft, sft_batch, sft_worker


def setup(task):
    cfg = load_config(RECIPE, [f"data.train_files=['{task['train']}']", f"model.path={task['model']}"])
    tokenizer = datasets.load_tokenizer(cfg)
    dataset = datasets.load_prompts(cfg.data.train_files, tokenizer, max_prompt_tokens=64, limit=None)
    return cfg, tokenizer, dataset


def test_sft_batch_is_prompt_then_answer_then_eos(task):
    _, tokenizer, dataset = setup(task)
    batch = sft_batch(dataset, [0, 1, 2], tokenizer)
    for i in range(3):
        item = dataset[i]
        n = int(batch["response_mask"][i].sum())
        response = batch["responses"][i, :n].tolist()
        assert response[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(response[:-1]) == item.extra_info["answer"]
        prompt = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()[:-n]
        assert prompt == list(item.prompt_ids)  # left padding removed, template applied once
    assert torch.equal(batch["input_ids"][:, -batch["responses"].shape[1] :], batch["responses"])


def test_sft_lowers_the_loss_and_syncs_the_rollout(task, tmp_path):
    cfg, tokenizer, dataset = setup(task)
    worker = sft_worker(cfg, tokenizer, total_steps=20)
    log = RunLog(tmp_path)
    run_sft(worker, dataset, tokenizer, examples_per_step=16, total_steps=20, seed=0, log=log)
    losses = [r["sft/loss"] for r in log.history]
    assert len(losses) == 20 and sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3
    assert worker.weight_version == 1  # the rollout engine now serves the SFT weights


def test_sft_command_trains_evaluates_and_saves_a_loadable_model(task, tmp_path):
    from transformers import AutoModelForCausalLM

    from stratarl.cli import main

    run_dir = tmp_path / "sft"
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "sft.total_steps=3",
        "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
    ]
    assert main(["sft", str(RECIPE), *overrides]) == 0
    AutoModelForCausalLM.from_pretrained(run_dir / "final")
    phases = [r["phase"] for r in RunLog.read(run_dir / "metrics.jsonl")]
    assert phases.count("sft") == 3 and phases.count("val") == 2


def test_an_example_longer_than_sft_max_tokens_is_refused_before_the_model_loads(task, tmp_path, capsys):
    from stratarl.cli import main

    _, tokenizer, dataset = setup(task)
    lengths = [
        len(it.prompt_ids) + len(tokenizer.encode(it.extra_info["answer"])) + 1 for it in dataset.items
    ]
    limit = sorted(lengths)[len(lengths) // 2]  # half of the examples are longer
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"model.path={task['model']}",
        f"trainer.run_dir={tmp_path / 'sft'}",
        f"data.val_files=['{task['test']}']",
        f"sft.max_tokens={limit}",
    ]
    assert main(["sft", str(RECIPE), *overrides]) == 2  # a config error: exit code 2, no traceback
    err = capsys.readouterr().err
    longer = sum(length > limit for length in lengths)
    assert (
        "sft.max_tokens" in err and f"{longer} rows" in err and f"the longest is {max(lengths)} tokens" in err
    )
    assert not (tmp_path / "sft" / "final").exists()


def test_run_sft_stops_at_an_example_longer_than_max_tokens(task, tmp_path):
    cfg, tokenizer, dataset = setup(task)
    worker = sft_worker(cfg, tokenizer, total_steps=2)
    with pytest.raises(ValueError, match=r"sft\.max_tokens=5: .* row \d+ is \d+ tokens"):
        run_sft(
            worker,
            dataset,
            tokenizer,
            examples_per_step=4,
            total_steps=2,
            seed=0,
            log=RunLog(tmp_path),
            max_tokens=5,
        )
    assert worker.weight_version == 0  # no step trained, nothing synced


def sft_output(task, monkeypatch, capsys, recipe, *overrides) -> str:
    """What `stratarl sft` prints before it trains (the training itself left out)."""
    from stratarl import cli
    from stratarl.trainer import sft

    monkeypatch.setattr(sft, "sft_from_config", lambda cfg, run_dir, console, stop=None: {})
    paths = [f"data.train_files=['{task['train']}']", f"model.path={task['model']}"]
    assert cli.main(["sft", str(recipe), *paths, *overrides]) == 0
    return capsys.readouterr().out


def test_sft_prints_the_warnings_about_what_it_reads(task, monkeypatch, capsys):
    no_val = "data.val_files=[]"
    out = sft_output(task, monkeypatch, capsys, RECIPE, no_val, "rollout.val_kwargs.n=2", "actor.lr=1e-3")
    assert "warning: rollout.val_kwargs.n > 1 with greedy decoding gives identical samples" in out
    assert "warning: data.val_files is empty: stratarl sft measures no held-out accuracy" in out
    assert "warning: actor.lr is given on the command line but not read by stratarl sft" in out
    assert out.count("warning:") == 3


def test_sft_leaves_out_the_warnings_about_rl_settings_it_does_not_read(task, tmp_path, monkeypatch, capsys):
    """A recipe shared with the RL run may set what only that run reads; its warnings are the RL
    run's (`stratarl train` prints them), not SFT's."""
    from stratarl.config import load_config, validate_config

    recipe = tmp_path / "rl.yaml"
    recipe.write_text(
        f"extends: {RECIPE}\n"
        "actor: {use_kl_loss: true}\n"
        "algorithm: {use_kl_in_reward: true}\n"
        "trainer: {test_freq: 5}\n"
        "async_training: {deterministic: true}\n"
    )
    val = f"data.val_files=['{task['test']}']"
    paths = [f"data.train_files=['{task['train']}']", f"model.path={task['model']}"]
    rl_warnings = validate_config(load_config(recipe, [*paths, "data.val_files=[]"]))
    assert any("penalized twice" in w for w in rl_warnings)
    assert any("async_training.deterministic=True has no effect" in w for w in rl_warnings)
    assert any("trainer.test_freq" in w for w in rl_warnings)
    assert "warning" not in sft_output(task, monkeypatch, capsys, recipe, val)
    assert "warning" not in sft_output(task, monkeypatch, capsys, RECIPE, val, "sft.lr=1e-3")


def test_sft_records_what_train_records_and_stops_on_a_plateau(task, tmp_path, capsys):
    """Held-out generations every sft.test_freq steps, the curves, and the result beside the weights.
    plateau_delta=1 (a gain of 100 % accuracy) can never be met: the first evaluation after step 0
    is the first miss, and patience 1 stops there, at step 2 of the planned 6."""
    import json

    from stratarl.cli import main

    run_dir = tmp_path / "sft"
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        "data.max_val_prompts=8",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "sft.total_steps=6",
        "sft.test_freq=2",
        "sft.stop_on_plateau=1",
        "sft.plateau_delta=1.0",
        "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
    ]
    assert main(["sft", str(RECIPE), *overrides]) == 0
    assert "sft stopped after step 2 of 6" in capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["planned_steps"] == 6 and summary["stopped_on_plateau"]
    assert sorted(summary["accuracy_by_step"]) == ["0", "2"]
    assert summary["accuracy_after"] == summary["accuracy_by_step"]["2"]
    for step in (0, 2):
        rows = [json.loads(line) for line in (run_dir / "val_generations" / f"step_{step}.jsonl").open()]
        assert len(rows) == 8 and {"prompt", "response", "ground_truth", "acc"} <= set(rows[0])
    assert (run_dir / "curves.png").stat().st_size > 0 and (run_dir / "plots" / "sft.png").stat().st_size > 0
    carried = json.loads((run_dir / "final" / "sft_result.json").read_text())
    assert carried["accuracy_after"] == summary["accuracy_after"] and carried["steps"] == 2
    steps = [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if r["phase"] == "sft"]
    assert steps == [1, 2]


def test_a_held_out_evaluation_during_sft_sees_that_steps_weights(task, tmp_path, monkeypatch):
    """Was: the engine was synced only after the last step, so an evaluation at sft.test_freq ran on
    the prompt KV cached at step 0 (the random init's): 0 % at step 600 on a task whose saved weights
    scored 29 %, and sft.stop_on_plateau stopped on that false plateau."""
    from stratarl.cli import main
    from stratarl.trainer import sft

    versions = []
    evaluate = sft.evaluate_accuracy
    monkeypatch.setattr(
        sft,
        "evaluate_accuracy",
        lambda worker, *a, **k: versions.append(worker.weight_version) or evaluate(worker, *a, **k),
    )
    overrides = [
        f"data.train_files=['{task['train']}']", f"data.val_files=['{task['test']}']",
        "data.max_val_prompts=4", f"model.path={task['model']}", f"trainer.run_dir={tmp_path / 'sft'}",
        "sft.total_steps=4", "sft.test_freq=1", "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
    ]  # fmt: skip
    assert main(["sft", str(RECIPE), *overrides]) == 0
    assert versions == [0, 1, 2, 3, 4]  # steps 0..3 as they run, step 4 after the final sync


def test_the_plateau_counts_evaluations_that_gain_less_than_delta():
    from stratarl.trainer.sft import Plateau

    plateau = Plateau(patience=2, delta=0.01)
    assert [plateau.update(a) for a in (0.10, 0.30, 0.305, 0.31, 0.35, 0.35, 0.355)] == [
        False,  # the first sets the best
        False,  # +0.20
        False,  # +0.005: a miss, and the best stays 0.30
        False,  # +0.010 over 0.30: progress
        False,  # +0.04
        False,  # a miss
        True,  # a second miss in a row
    ]
    assert Plateau(patience=0, delta=0.01).update(0.0) is False  # 0: never stops


def test_train_warns_when_the_sft_model_it_starts_from_scored_too_low_for_group_signal(tmp_path):
    import json

    from stratarl.trainer.sft import sft_warm_start_warning

    model = tmp_path / "final"
    model.mkdir()
    cfg = load_config(RECIPE, [f"model.path={model}", "rollout.n=8"])
    assert sft_warm_start_warning(cfg) is None  # no SFT result: another model
    (model / "sft_result.json").write_text(json.dumps({"accuracy_after": 0.04, "steps": 300}))
    warning = sft_warm_start_warning(cfg)
    assert warning is not None and "4.0% held-out accuracy after 300 steps" in warning
    assert "rollout.n=8 about 28% of groups" in warning
    (model / "sft_result.json").write_text(json.dumps({"accuracy_after": 0.57, "steps": 600}))
    assert sft_warm_start_warning(cfg) is None
    cfg = load_config(RECIPE, [f"model.path={model}", "rollout.n=2"])  # 1 − .57² − .43² = 0.49
    assert "rollout.n=2 about 49% of groups" in sft_warm_start_warning(cfg)
    assert "train SFT longer" in warning
    # Was: the same advice at 92.5 % (examples/reverse_words), where more SFT leaves fewer groups.
    (model / "sft_result.json").write_text(json.dumps({"accuracy_after": 0.925, "steps": 700}))
    high = sft_warm_start_warning(load_config(RECIPE, [f"model.path={model}", "rollout.n=8"]))
    assert "about 46% of groups" in high and "most groups would be all right" in high
    assert "train SFT longer" not in high


def test_stop_on_plateau_without_held_out_evaluations_is_refused_naming_the_keys(task):
    from stratarl.config import ConfigError, validate_config

    cfg = load_config(RECIPE, [f"model.path={task['model']}", "sft.stop_on_plateau=3", "sft.test_freq=0"])
    with pytest.raises(ConfigError, match=r"sft\.stop_on_plateau stops on held-out accuracy"):
        validate_config(cfg)


def test_the_doctor_reads_an_sft_run(task, tmp_path):
    """Was: "no training step logged yet" and nothing else. An SFT run of 3 steps leaves the tiny model
    at ~0 % held-out accuracy: too low for GRPO's groups to carry signal, which the doctor says."""
    from stratarl.cli import main
    from stratarl.observe.doctor.diagnosis import diagnose, run_status
    from stratarl.observe.doctor.view import load_run

    run_dir = tmp_path / "sft"
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        "data.max_val_prompts=8",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "sft.total_steps=3",
        "sft.trajectories_per_step=8",
        "sft.trajectories_per_micro_batch=8",
    ]
    assert main(["sft", str(RECIPE), *overrides]) == 0
    view = load_run(run_dir)
    assert run_status(view).startswith("SFT steps 1..3 of 3, finished")
    findings = diagnose(view)
    by_title = {f.title: f for f in findings}
    assert "an SFT run" in by_title and "sft/loss" in by_title["an SFT run"].evidence[0]
    low = by_title["held-out accuracy too low for GRPO to find signal"]
    assert low.severity == "warning" and low.layer == "config" and "rollout.n" in low.evidence[0]
    assert not [f for f in findings if f.severity == "problem"], findings


def _rows_without_answers(src, dst, keep: int):
    """The first `keep` rows of `src` with extra_info.answer removed, written to `dst`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(src).to_pylist()[:keep]
    for row in rows:
        row["extra_info"] = {k: v for k, v in row["extra_info"].items() if k != "answer"}
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return dst


def test_sft_trains_on_sft_train_files_when_given(task, tmp_path, monkeypatch):
    """sft.train_files are SFT's rows, data.train_files (the RL run's) are not read; empty: the RL run's."""
    import pyarrow.parquet as pq

    from stratarl.trainer import sft

    own = tmp_path / "sft_rows.parquet"
    pq.write_table(pq.read_table(task["train"]).slice(0, 10), own)
    # GRPO's rows have no reference answers: SFT would refuse them
    rl = _rows_without_answers(task["train"], tmp_path / "rl_rows.parquet", keep=64)
    trained_on = []
    monkeypatch.setattr(sft, "_sft_run", lambda cfg, claim, log, tok, rows, *rest: trained_on.append(rows))
    paths = [f"data.train_files=['{rl}']", f"model.path={task['model']}", "data.val_files=[]"]
    cfg = load_config(RECIPE, [*paths, f"sft.train_files=['{own}']", f"trainer.run_dir={tmp_path / 'a'}"])
    sft.sft_from_config(cfg, tmp_path / "a")
    assert len(trained_on[0]) == 10 and {it.source_file for it in trained_on[0].items} == {str(own)}
    from stratarl.config import ConfigError

    cfg = load_config(RECIPE, [*paths, f"trainer.run_dir={tmp_path / 'b'}"])
    with pytest.raises(ConfigError, match=r"data\.train_files.*SFT needs extra_info\['answer'\]"):
        sft.sft_from_config(cfg, tmp_path / "b")  # empty sft.train_files: the RL rows


def test_sft_train_files_are_checked_and_named(task, tmp_path):
    """A missing file, and SFT rows without reference answers, are errors naming sft.train_files."""
    from stratarl.config import ConfigError, validate_config
    from stratarl.trainer import sft

    paths = [f"data.train_files=['{task['train']}']", f"model.path={task['model']}", "data.val_files=[]"]
    missing = tmp_path / "missing.parquet"
    with pytest.raises(ConfigError, match=rf"sft\.train_files: file not found: {missing}"):
        validate_config(load_config(RECIPE, [*paths, f"sft.train_files=['{missing}']"]))
    bare = _rows_without_answers(task["train"], tmp_path / "bare.parquet", keep=8)
    cfg = load_config(RECIPE, [*paths, f"sft.train_files=['{bare}']", f"trainer.run_dir={tmp_path / 'r'}"])
    with pytest.raises(ConfigError, match=r"sft\.train_files: SFT needs extra_info\['answer'\] .*: 8 rows"):
        sft.sft_from_config(cfg, tmp_path / "r")


def test_an_sft_run_that_dies_of_an_exception_is_recorded_failed_with_the_error(task, tmp_path, monkeypatch):
    """Was: run.json still said `running` after SFT died (only `stratarl train` recorded a failure).
    A loss that raises at step 2: run.json says failed, with the error and the phase it left, the
    doctor reads it so, and hang/error-*/report.json holds it."""
    import json

    from stratarl.observe.doctor.diagnosis import run_status
    from stratarl.observe.doctor.view import load_run
    from stratarl.trainer import sft

    real_loss, calls = sft.sft_loss, []

    def breaks_at_step_two(micro, scores, totals):
        calls.append(1)
        if len(calls) > 1:  # one micro-batch per step: the second call is step 2's
            raise ValueError("the loss saw a NaN")
        return real_loss(micro, scores, totals)

    monkeypatch.setattr(sft, "sft_loss", breaks_at_step_two)
    run_dir = tmp_path / "sft"
    cfg = load_config(
        RECIPE,
        [
            f"data.train_files=['{task['train']}']", "data.val_files=[]", f"model.path={task['model']}",
            f"trainer.run_dir={run_dir}", "sft.total_steps=3", "sft.trajectories_per_step=8",
            "sft.trajectories_per_micro_batch=8",
        ],
    )  # fmt: skip
    with pytest.raises(ValueError, match="the loss saw a NaN"):
        sft.sft_from_config(cfg, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["error"] == "ValueError: the loss saw a NaN"
    assert record["failed_in"] == "sft.update (step 2)"
    assert "failed (ValueError: the loss saw a NaN)" in run_status(load_run(run_dir))
    (report,) = (run_dir / "hang").glob("error-*/report.json")
    assert json.loads(report.read_text())["phase"] == "sft.update (step 2)"
