"""The audit hook is per interpreter: a program must not get a new one (where its code would run
unseen) — refused in `run_python` and in the code scorer, by import and by the creation event."""

import pytest

from stratarl.reward.code_exec import compute_score
from stratarl.reward.sandbox import SandboxLimits, run_python
from stratarl.reward.sandbox_guard import make_hook
from stratarl.reward.sandbox_namespace import sandbox_problem

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}")

FAST = SandboxLimits(wall_seconds=5.0, cpu_seconds=3, output_bytes=10_000)
# Whichever module this interpreter has; the new interpreter would print without the hook.
ESCAPE = """
import importlib.util
names = ["_interpreters", "_xxsubinterpreters", "concurrent.interpreters"]
name = next(n for n in names if "." not in n and importlib.util.find_spec(n))
module = __import__(name)
interp = module.create()
module.run_string(interp, "print('unseen by the hook')")
"""


def test_run_python_refuses_a_subinterpreter():
    result = run_python(ESCAPE, limits=FAST)
    assert result.status == "error"
    assert "sandbox: importing _" in result.stderr and "not allowed" in result.stderr
    assert "unseen" not in result.stdout


def test_the_code_scorer_refuses_a_subinterpreter():
    response = "```python\n" + ESCAPE + "```"
    cases = {"inputs": [""], "outputs": ["unseen by the hook\n"]}
    outcome = compute_score("code", response, cases, limits=FAST)
    assert outcome["score"] == 0.0 and outcome["first_failure"] == "error"


def test_creating_an_interpreter_is_refused_even_when_its_module_is_loaded(tmp_path):
    hook = make_hook(str(tmp_path), ())
    with pytest.raises(PermissionError, match="not allowed"):
        hook("cpython.PyInterpreterState_New", ())
    for name in ("_xxsubinterpreters", "_interpreters", "concurrent.interpreters"):
        with pytest.raises(PermissionError, match=f"importing {name}"):
            hook("import", (name, None, None, None, None))
    hook("import", ("concurrent.futures", None, None, None, None))  # its siblings stay importable
