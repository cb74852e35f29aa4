"""docs/config.md is generated from the schema, is current, and documents every setting."""

from pathlib import Path

from stratarl.config import RunConfig
from stratarl.config.markdown import render_config_markdown
from stratarl.config.setting import leaf_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_current():
    assert DOC.read_text() == render_config_markdown(), (
        "docs/config.md is stale: run `python -m stratarl.config.markdown docs/config.md`"
    )


def test_every_setting_appears_with_its_doc():
    text = render_config_markdown()
    for key, info in leaf_settings(RunConfig).items():
        assert f"| `{key}` |" in text, key
        assert info.doc.replace("|", "\\|") in text, key
