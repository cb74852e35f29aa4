"""Layer 5, agent loops: a local text-search tool over a user's corpus, ranked with BM25.

The corpus is a `.jsonl` file of {"id", "text"} objects, a `.txt` file with one document per line,
or a directory of `.txt` files (one document each, id = file name). Scores are Okapi BM25
(Robertson & Zaragoza, 2009): for query terms q,
    score(d) = Σ_q idf(q) · f(q,d)·(k1+1) / (f(q,d) + k1·(1 − b + b·|d|/avgdl)),
    idf(q) = ln(1 + (N − n_q + 0.5)/(n_q + 0.5)).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from stratarl.agent.tools.base import Tool, ToolResult

_WORD = re.compile(r"\w+")

SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document collection; returns the best matching passages.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "words to look for"},
                "top_k": {"type": "integer", "description": "how many results (default 3)"},
            },
            "required": ["query"],
        },
    },
}


def read_corpus(path: str | Path) -> list[tuple[str, str]]:
    """[(doc id, text)] from a .jsonl file, a .txt file (one doc per line) or a directory of .txt files."""
    source = Path(path)
    if source.is_dir():
        return [(f.name, f.read_text(encoding="utf-8")) for f in sorted(source.glob("*.txt"))]
    lines = source.read_text(encoding="utf-8").splitlines()
    if source.suffix == ".jsonl":
        rows = [json.loads(line) for line in lines if line.strip()]
        return [(str(row.get("id", i)), str(row["text"])) for i, row in enumerate(rows)]
    return [(str(i), line) for i, line in enumerate(lines) if line.strip()]


def tokenize(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


class BM25Index:
    """An in-memory BM25 index over (id, text) documents."""

    def __init__(self, documents: list[tuple[str, str]], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.documents, self.k1, self.b = documents, k1, b
        self.term_counts = [Counter(tokenize(text)) for _, text in documents]
        self.lengths = [sum(c.values()) for c in self.term_counts]
        self.avg_length = sum(self.lengths) / max(len(documents), 1)
        self.doc_freq: Counter[str] = Counter(t for counts in self.term_counts for t in counts)

    def idf(self, term: str) -> float:
        n_q = self.doc_freq.get(term, 0)
        return math.log(1 + (len(self.documents) - n_q + 0.5) / (n_q + 0.5))

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for counts, length in zip(self.term_counts, self.lengths, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / max(self.avg_length, 1e-9))
            out.append(
                sum(self.idf(t) * counts[t] * (self.k1 + 1) / (counts[t] + norm) for t in terms if counts[t])
            )
        return out

    def search(self, query: str, top_k: int) -> list[tuple[str, str, float]]:
        """The best `top_k` documents with a positive score, best first (ties by corpus order)."""
        ranked = sorted(enumerate(self.scores(query)), key=lambda pair: (-pair[1], pair[0]))
        return [(*self.documents[i], s) for i, s in ranked[:top_k] if s > 0]


class TextSearchTool(Tool):
    """config: {"corpus_path": ..., "snippet_chars": 300}; arguments: {"query": str, "top_k": int}."""

    def __init__(self, config: dict[str, Any] | None = None, schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, schema or SCHEMA)
        if "corpus_path" not in self.config:
            raise ValueError("TextSearchTool needs config['corpus_path']")
        self.index = BM25Index(read_corpus(self.config["corpus_path"]))
        self.snippet_chars = int(self.config.get("snippet_chars", 300))

    async def execute(self, instance_id: str, arguments: dict[str, Any], **context: Any) -> ToolResult:
        self.check_arguments(arguments)
        top_k = int(arguments.get("top_k", 3))
        hits = self.index.search(str(arguments["query"]), max(1, min(top_k, 10)))
        if not hits:
            return ToolResult("no results")
        lines = [
            f"[{i + 1}] ({doc_id}) {text[: self.snippet_chars]}" for i, (doc_id, text, _) in enumerate(hits)
        ]
        return ToolResult("\n".join(lines), metrics={"num_hits": len(hits)})
