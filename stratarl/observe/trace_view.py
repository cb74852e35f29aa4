"""Cross-cutting: `stratarl trace` in the terminal — the ten answers for one trajectory (rich), and its
tokens coloured by mask with the reward's token marked.

    prompt (dim) · action = sampled, response_mask 1 (green) · observation = tool result or user
    turn, mask 0 (yellow) · padding (grey) · the reward's token (reversed)
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stratarl.observe.trace_answers import ten_answers, token_pieces

STYLES = {"prompt": "dim", "action": "green", "observation": "yellow", "padding": "bright_black"}
REWARD_STYLE = "bold reverse magenta"


def tokens_text(row: dict[str, Any], tokenizer: Any | None) -> Text:
    """The prompt and response as one coloured text; padding is shown as a count, not token by token."""
    out = Text()
    padding = 0
    for piece in token_pieces(row, tokenizer):
        if piece.kind == "padding":
            padding += 1
            continue
        style = REWARD_STYLE if piece.is_reward else STYLES[piece.kind]
        out.append(piece.text, style=style)
    if padding:
        out.append(f"  [+{padding} padding tokens]", style=STYLES["padding"])
    return out


def legend() -> Text:
    text = Text("tokens: ")
    for kind, style in STYLES.items():
        text.append(f" {kind} ", style=style)
    text.append(" reward token ", style=REWARD_STYLE)
    return text


def render_trace(row: dict[str, Any], tokenizer: Any | None, console: Console) -> None:
    """Print the ten answers, then the coloured tokens."""
    console.rule(f"[bold]trajectory {row.get('trajectory_id')}[/bold] · step {row.get('step')}")
    for answer in ten_answers(row):
        table = Table(show_header=False, box=None, padding=(0, 1), expand=True)
        table.add_column(style="cyan", no_wrap=True, min_width=24)
        table.add_column(overflow="fold")
        for label, value in answer.lines:
            table.add_row(label, value)
        console.print(Panel(table, title=f"{answer.number}. {answer.question}", title_align="left"))
    console.print(
        Panel(Group(legend(), tokens_text(row, tokenizer)), title="tokens by mask", title_align="left")
    )
