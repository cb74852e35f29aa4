"""The first_alphabetical example's reward (docs/own_task.md#three-more-tasks), with verl's signature: 1 for
exactly the word of the list that comes first alphabetically after 'Answer: ', else 0; `acc` and
`format_ok` ride along as extras (metrics, records)."""

import re

ANSWER = re.compile(r"^\s*Answer: ([a-z]+(?: [a-z]+)*)\s*$")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    match = ANSWER.match(solution_str)
    correct = match is not None and match.group(1) == ground_truth
    return {"score": float(correct), "acc": float(correct), "format_ok": float(match is not None)}
