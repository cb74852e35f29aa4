"""The process pool: concurrent scoring, per-sample timeouts that kill, exits, crashes, errors and
output counted per data source; the pool keeps working after each."""

import re
import time

import pytest

from stratarl.reward.batch_scorer import score_batch
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.registry import UnknownDataSourceError, default_compute_score
from tests.reward.pool_scorers import misbehaving


@pytest.fixture(scope="module")
def pool():
    with ScoringPool(misbehaving, num_workers=2, timeout_s=1.5) as p:
        yield p


def test_a_hang_a_crash_and_an_error_cost_one_sample_each(pool):
    texts = ["a", "hang", "boom", "die", "b", "async"]
    started = time.monotonic()
    result = pool.score_batch(["d"] * 6, texts, ["a", "x", "x", "x", "b", "t"])
    assert time.monotonic() - started < 8.0
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.25]
    assert result.failures == {"timeout": 1, "ValueError": 1, "process_exit": 1}
    assert result.sample_failures == [None, "timeout", "ValueError", "process_exit", None, None]
    # the timeout says where the scorer was stuck: its worker dumped its stacks before the kill
    (timeout,) = [e for e in result.failure_examples if ": timeout:" in e]
    # the `while True: pass` of pool_scorers.py: the dump lands on either of its two lines
    assert re.search(r'pool_scorers\.py", line 1[34] in misbehaving', timeout), timeout
    assert result.extra["truth"][5] == "t"  # an async scorer's dict, extras kept
    assert pool.restarts >= 2
    again = pool.score_batch(["d", "d"], ["x", "y"], ["x", "z"])  # the pool still works
    assert again.scores.tolist() == [1.0, 0.0] and again.failures == {}


def test_exits_crashes_and_output_are_counted_per_data_source(pool):
    texts = ["exit0", "sysexit", "segfault", "print", "a"]
    result = pool.score_batch(["s1", "s1", "s2", "s2", "s2"], texts, ["", "", "", "", "a"])
    assert result.scores.tolist() == [0.0, 0.0, 0.0, 0.75, 1.0]
    assert result.failures == {"process_exit": 1, "SystemExit": 1, "process_crash": 1}
    metrics = result.metrics()
    assert metrics["reward/failures/s1/process_exit"] == 1.0
    assert metrics["reward/failures/s1/SystemExit"] == 1.0
    assert metrics["reward/failures/s2/process_crash"] == 1.0
    assert metrics["reward/failures/total"] == 3.0
    # 1 MB printed: counted, 4 KB of it kept, none of it on our stdout
    assert metrics["reward/output/bytes"] >= 2**20 and metrics["reward/output/capped_calls"] == 1.0
    assert "SIGSEGV" in " ".join(result.failure_examples)


def test_work_is_spread_over_the_workers(pool):
    result = pool.score_batch(["d"] * 4, ["sleep:0.4", "sleep:0.4", "a", "a"], ["", "", "a", "a"])
    assert result.scores.tolist() == [0.5, 0.5, 1.0, 1.0]
    pids = {p for p in result.extra["pid"] if p is not None}
    assert len(pids) >= 1


def test_the_clock_starts_when_a_worker_takes_the_sample():
    # one worker, three 0.5 s samples, a 1.2 s limit: the third waits 1 s in the queue and still passes
    with ScoringPool(misbehaving, num_workers=1, timeout_s=1.2) as pool:
        result = pool.score_batch(["d"] * 3, ["sleep:0.5"] * 3, [""] * 3)
    assert result.scores.tolist() == [0.5, 0.5, 0.5] and result.failures == {}


def test_matches_the_in_process_scorer_on_the_registry():
    sources = ["arithmetic", "gsm8k", "tool_arithmetic", "arithmetic", "openai/gsm8k"]
    texts = ["Answer: 4", "so #### 1,000", "<tool_call>{}</tool_call>Answer: 7", "Answer:4", "#### 3"]
    truths = ["4", "1000", "7", "4", "2"]
    in_process = score_batch(sources, texts, truths)
    with ScoringPool(default_compute_score, num_workers=2, timeout_s=10) as pool:
        pooled = pool.score_batch(sources, texts, truths)
        assert pooled.scores.tolist() == in_process.scores.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
        assert pooled.extra == in_process.extra
        with pytest.raises(UnknownDataSourceError, match="nowhere"):
            pool.score_batch(["nowhere"], ["x"], ["y"])


def test_a_custom_async_file_scorer_in_workers_and_in_process(tmp_path):
    path = tmp_path / "my_async_reward.py"
    path.write_text(
        "import asyncio\n"
        "async def score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    await asyncio.sleep(0)\n"
        "    return {'score': float(solution_str == ground_truth) + bonus, 'length': len(solution_str)}\n"
    )
    scorer = load_custom_scorer(path, "score", bonus=0.5)
    local = score_batch(["d", "d"], ["ab", "c"], ["ab", "x"], compute_score=scorer)
    with ScoringPool(scorer, num_workers=1, timeout_s=10) as pool:
        pooled = pool.score_batch(["d", "d"], ["ab", "c"], ["ab", "x"])
    assert local.scores.tolist() == pooled.scores.tolist() == [1.5, 0.5]
    assert pooled.extra["length"] == [2, 1]


def test_a_pool_whose_workers_cannot_start_fails_its_samples_instead_of_hanging(tmp_path):
    path = tmp_path / "vanishing_reward.py"
    path.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    scorer = load_custom_scorer(path, "score")
    path.unlink()  # the workers reload the file by path and cannot
    with ScoringPool(scorer, num_workers=1, timeout_s=5) as pool:
        result = pool.score_batch(["d", "d"], ["a", "b"], ["a", "b"])
        assert result.scores.tolist() == [0.0, 0.0] and result.failures == {"pool_broken": 2}
        assert "failed to start" in pool.broken and "vanishing_reward.py" in pool.broken
        with pytest.raises(RuntimeError, match="failed to start"):
            pool.submit("d", "a", "a")
