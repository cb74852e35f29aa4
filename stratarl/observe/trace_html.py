"""Cross-cutting: `stratarl trace --html` — one self-contained page (inline CSS, no scripts, no
network) with the ten answers for one trajectory and its tokens coloured by mask."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from stratarl.observe.trace_answers import ten_answers, token_pieces

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 1.2em 0 0.3em; }
table { border-collapse: collapse; width: 100%; } td { padding: 2px 8px; vertical-align: top; }
td.label { color: #036; white-space: nowrap; width: 14em; } td.value { white-space: pre-wrap; }
.tokens { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7;
          border: 1px solid #ccc; padding: 0.8em; }
.tokens span { border-radius: 2px; }
.prompt { color: #777; } .action { background: #d8f5d0; } .observation { background: #fde9a8; }
.padding { background: #eee; color: #aaa; } .reward { outline: 2px solid #b0c; background: #f3c9f7; }
.legend span { padding: 1px 6px; margin-right: 6px; }
"""


def trace_page(row: dict[str, Any], tokenizer: Any | None) -> str:
    """The HTML text of the page."""
    title = f"trajectory {row.get('trajectory_id')} · step {row.get('step')}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>")
    for answer in ten_answers(row):
        parts.append(f"<h2>{answer.number}. {html.escape(answer.question)}</h2><table>")
        for label, value in answer.lines:
            cells = f"<td class='label'>{html.escape(label)}</td><td class='value'>{html.escape(value)}</td>"
            parts.append(f"<tr>{cells}</tr>")
        parts.append("</table>")
    parts.append("<h2>tokens by mask</h2><p class='legend'>")
    for kind in ("prompt", "action", "observation", "padding"):
        parts.append(f"<span class='{kind}'>{kind}</span>")
    parts.append("<span class='reward'>reward token</span></p><div class='tokens'>")
    for piece in token_pieces(row, tokenizer):
        classes = piece.kind + (" reward" if piece.is_reward else "")
        parts.append(f"<span class='{classes}' title='id {piece.token_id}'>{html.escape(piece.text)}</span>")
    parts.append("</div></body></html>\n")
    return "".join(parts)


def write_trace_page(row: dict[str, Any], tokenizer: Any | None, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(trace_page(row, tokenizer), encoding="utf-8")
    return path
