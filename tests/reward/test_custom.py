"""Custom reward functions loaded by file path + name, with clear errors naming the path and function."""

import pytest

from stratarl.reward.batch_scorer import score_batch
from stratarl.reward.custom import load_custom_scorer

SOURCE = """
def length_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return {"score": scale * len(solution_str), "source": data_source}

def helper():
    pass

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_load_call_and_bind_kwargs(reward_file):
    fn = load_custom_scorer(reward_file, "length_score")
    assert fn("d", "abc", None) == {"score": 3.0, "source": "d"}
    scaled = load_custom_scorer(str(reward_file), "length_score", scale=0.5)
    result = score_batch(["d", "d"], ["ab", "abcd"], [None, None], compute_score=scaled)
    assert result.scores.tolist() == [1.0, 2.0] and result.extra["source"] == ["d", "d"]


def test_missing_function_names_path_and_lists_callables(reward_file):
    with pytest.raises(AttributeError, match=r"my_reward\.py has no function 'score'.*helper, length_score"):
        load_custom_scorer(reward_file, "score")
    with pytest.raises(TypeError, match="NOT_A_FUNCTION"):
        load_custom_scorer(reward_file, "NOT_A_FUNCTION")


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.py.*'score'"):
        load_custom_scorer(tmp_path / "nowhere.py", "score")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ImportError, match=r"broken\.py"):
        load_custom_scorer(broken, "f")


def test_a_loaded_scorer_pickles_as_its_path_and_reloads(reward_file):
    import pickle

    fn = load_custom_scorer(reward_file, "length_score", scale=2.0)
    clone = pickle.loads(pickle.dumps(fn))
    assert clone("d", "abc", None) == {"score": 6.0, "source": "d"}
    assert clone.path == reward_file.resolve() and "my_reward.py:length_score" in repr(clone)


def test_async_scorer_in_process_also_inside_a_running_event_loop(tmp_path):
    import asyncio

    path = tmp_path / "async_reward.py"
    path.write_text(
        "async def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.75\n"
    )
    fn = load_custom_scorer(path, "score")
    assert score_batch(["d"], ["x"], [None], compute_score=fn).scores.tolist() == [0.75]

    async def inside_a_loop():
        return score_batch(["d"], ["x"], [None], compute_score=fn).scores.tolist()

    assert asyncio.run(inside_a_loop()) == [0.75]
