"""Every relative link of README.md and docs/ (the benchmark records' index among them) leads to a file that exists: a
record renamed when a newer run of its class took the undated name, or a document moved, would leave a dead link."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_targets(document: Path) -> list[str]:
    """Links without a scheme (http:, mailto:) or a bare #anchor, with any #anchor cut off."""
    targets = LINK.findall(document.read_text(encoding="utf-8"))
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_documents_have_relative_links():
    assert sum(len(relative_targets(document)) for document in documents()) > 50


def test_every_relative_link_resolves():
    broken = [
        f"{document.relative_to(ROOT)}: {target}"
        for document in documents()
        for target in relative_targets(document)
        if not (document.parent / target).exists()
    ]
    assert broken == []
