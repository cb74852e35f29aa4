"""The doctor's check of a distillation teacher against the task reward, on run directories written
as the trainer writes them: a teacher that prefers the low-reward responses, and one at chance, are
config warnings naming distillation.distillation_loss_coef; a teacher that agrees with the reward,
one trained alone (use_task_rewards=false) and a run without distillation say nothing."""

from tests.observe.test_doctor_findings import GROUPS, N, alarming, config, findings, healthy_rows, write_run

DISTILL = {"enabled": True, "use_task_rewards": True, "distillation_loss_coef": 1.0}


def rows_with_teacher(agrees_in):
    """The healthy rows (two right, two wrong per group) with a teacher log-prob mean per row: the
    teacher prefers the rewarded ones in the groups g where agrees_in(step, g)."""

    def rows(step):
        out = healthy_rows(step)
        for i, row in enumerate(out):
            group, rewarded = i // N, row["reward"] > 0
            prefers = rewarded == agrees_in(step, group)
            row["teacher_log_prob_mean"] = -1.0 - 0.1 * (i % N) if prefers else -3.0 - 0.1 * (i % N)
        return out

    return rows


def distill_run(path, agrees_in, **distillation):
    cfg = config(distillation=DISTILL | distillation)
    return write_run(path, cfg=cfg, rows=rows_with_teacher(agrees_in))


def test_a_teacher_that_prefers_what_the_reward_scores_low_is_a_config_warning(tmp_path):
    found = findings(distill_run(tmp_path / "run", lambda step, g: False))
    finding = found["teacher_disagrees"]
    assert finding.severity == "warning" and finding.layer == "config"
    assert "prefers the responses the reward scores low" in finding.title
    assert "in 0% of 320 traced pairs" in finding.evidence[0]  # 10 steps × 8 groups × 2·2 pairs
    assert "distillation.distillation_loss_coef" in finding.next_step
    assert "distillation.teacher_model_path" in finding.next_step


def test_a_teacher_at_chance_is_named_and_one_that_agrees_is_not(tmp_path):
    at_chance = findings(distill_run(tmp_path / "chance", lambda step, g: g < GROUPS // 2))
    assert "chance level" in at_chance["teacher_disagrees"].title
    assert "in 50% of 320" in at_chance["teacher_disagrees"].evidence[0]
    mostly = distill_run(tmp_path / "agrees", lambda step, g: g != 0)  # 7 of 8 groups: 88%
    assert alarming(mostly) == {}


def test_no_finding_without_the_task_reward_in_the_loss_or_without_distillation(tmp_path):
    alone = distill_run(tmp_path / "alone", lambda step, g: False, use_task_rewards=False)
    assert "teacher_disagrees" not in findings(alone)
    off = distill_run(tmp_path / "off", lambda step, g: False, enabled=False)
    assert "teacher_disagrees" not in findings(off)
