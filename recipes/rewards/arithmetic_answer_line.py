"""Reward for the arithmetic task on a chat model that shows its working (SmolLM2-135M-Instruct).

Point a run at it with `reward.custom_function_path=recipes/rewards/arithmetic_answer_line.py`.
The task's own rule (`stratarl.reward.arithmetic`) accepts only a reply that is exactly
`Answer: <integer>`; an instruct model that was never trained on that format writes "7 + 8 = 15"
instead, so the strict rule pays nothing and GRPO sees no signal. Here the reply may show its
working, and the rule is on its end:

    score = 1.0   the reply ends with `Answer: N` (after a space or a line break; an optional final
                  ".") and N is the right integer
            0.5   the last integer in the reply is right, without that answer line
            0.2   the reply ends with `Answer: M`, M wrong (the format alone)
            0     otherwise

Extras, logged as metrics: `acc` (ends with the right answer line: the task's success),
`correct` (the last integer is right), `format_ok` (ends with an answer line), `exact` (the reply is
exactly `Answer: N` with N right: the strict rule of `stratarl.reward.arithmetic`).
"""

import re

_ANSWER_LINE = re.compile(r"(?:^|\s)Answer: (0|-?[1-9][0-9]*)\.?$")
_INTEGER = re.compile(r"-?\d+")
_EXACT = re.compile(r"Answer: (0|-?[1-9][0-9]*)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    truth = int(str(ground_truth).strip())
    text = solution_str.strip()
    line = _ANSWER_LINE.search(text)
    numbers = _INTEGER.findall(text)
    correct = bool(numbers) and int(numbers[-1]) == truth
    acc = line is not None and int(line.group(1)) == truth
    exact = (match := _EXACT.fullmatch(text)) is not None and int(match.group(1)) == truth
    score = 1.0 if acc else 0.5 if correct else 0.2 if line is not None else 0.0
    return {
        "score": score,
        "acc": float(acc),
        "correct": float(correct),
        "format_ok": float(line is not None),
        "exact": float(exact),
    }
