"""Layer 4, data transport: the field contracts written out for people.

`explain_field(name)` is what `stratarl explain-field NAME` prints; `render_fields_markdown()` is
the whole of `docs/fields.md` (a test keeps the file equal to it). Both read only `fields.FIELDS`,
so the documentation cannot drift from what `validate` enforces.
"""

from __future__ import annotations

from stratarl.transport.fields import DTYPE_KINDS, FIELDS, PHASES, SHAPE_LETTERS, FieldSpec, field_spec

DOC_PATH = "docs/fields.md"


def explain_field(name: str) -> str:
    """The contract of one field as a few lines of text; KeyError (listing the fields) if undeclared."""
    spec = field_spec(name)
    lines = [
        f"{spec.name}: {spec.meaning}",
        f"  dtype      {_dtype_text(spec)}",
        f"  shape      {spec.shape_text}   ({_letters_text(spec)})",
        f"  mask       {_mask_text(spec)}",
        f"  produced   {spec.producer}",
        f"  consumed   {', '.join(spec.consumers)}",
    ]
    return "\n".join(lines)


def render_fields_markdown() -> str:
    """The text of docs/fields.md, generated from the declarations."""
    lines = [
        "# Field contracts",
        "",
        "<!-- Generated from stratarl/transport/fields.py by render_fields_markdown(); do not edit.",
        "     Regenerate: python -c 'import stratarl.transport.field_docs as d; d.write_fields_markdown()'",
        "-->",
        "",
        "Every standard column of a batch, declared once in `stratarl/transport/fields.py`. Phases",
        "check what they read and write with `stratarl.transport.field_checks.validate(batch, reads=[...],",
        "writes=[...], phase=...)`: presence, dtype, shapes consistent with each other, 0/1 masks, and no",
        "NaN or inf under a field's mask. `stratarl explain-field NAME` prints one entry.",
        "",
        "## Shape letters",
        "",
        *[f"- `{letter}`: {text}" for letter, text in SHAPE_LETTERS.items()],
        "- `P+T`: the full sequence, prompt followed by response",
        "",
        "## Dtype kinds",
        "",
        *[f"- `{kind}`: {text}" for kind, (text, _) in DTYPE_KINDS.items()],
        "",
        "## Phases, in step order",
        "",
        " → ".join(f"`{phase}`" for phase in PHASES),
        "",
        "## Fields",
        "",
        "| field | dtype | shape | mask | produced by | consumed by | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec in FIELDS.values():
        consumers = ", ".join(spec.consumers)
        mask = f"`{spec.mask}`" if spec.mask else "—"
        lines.append(
            f"| `{spec.name}` | {spec.dtype} | `{spec.shape_text}` | {mask} | {spec.producer} | {consumers} "
            f"| {spec.meaning.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def write_fields_markdown(path: str = DOC_PATH) -> None:
    """Regenerate docs/fields.md (run from the repository root)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_fields_markdown())


def _dtype_text(spec: FieldSpec) -> str:
    return f"{spec.dtype}: {DTYPE_KINDS[spec.dtype][0]}"


def _letters_text(spec: FieldSpec) -> str:
    letters = [x for x in ("N", "P", "T") if any(x in dim for dim in spec.shape)]
    return "; ".join(f"{x} = {SHAPE_LETTERS[x]}" for x in letters)


def _mask_text(spec: FieldSpec) -> str:
    if spec.mask is None:
        return "none (every entry is meaningful)" if spec.dtype != "mask" else "none (this is a mask)"
    text = f"{spec.mask}: entries where it is 0 carry no meaning (padding, observations)"
    return text + "; NaN/inf where it is 1 are rejected" if spec.dtype == "float" else text
