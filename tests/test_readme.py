"""The README tells the truth about the repository: every file it names exists, and no file points outside it."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# repository paths the README names in backticks or links: checkpoints/x.pt, docs/nac.md, agent/data/dataset.py, ...
TRACKED_DIRS = ("agent", "policies", "envs", "benchmarks", "checkpoints", "docs", "tests")


def named_paths(text: str) -> set[str]:
    candidates = set(re.findall(r"`([^`\s]+)`", text)) | set(re.findall(r"\]\(([^)\s]+)\)", text))
    out = set()
    for c in candidates:
        c = c.strip().rstrip(".,;:")
        if c.split("/")[0] in TRACKED_DIRS and "<" not in c and "*" not in c and "=" not in c:
            out.add(c)
    return out


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    paths = named_paths(text) | named_paths((ROOT / "docs" / "udacity.md").read_text())
    assert len(paths) > 10, "the README names the project's files"
    missing = sorted(p for p in paths if not (ROOT / p.split("#")[0]).exists())
    assert not missing, f"README names files that do not exist: {missing}"
    anchors = [p for p in paths if "#" in p]
    assert anchors, "the README links sections of the docs"
    broken = [p for p in anchors
              if p.split("#", 1)[1] not in heading_anchors((ROOT / p.split("#")[0]).read_text())]
    assert not broken, f"README links sections that do not exist: {broken}"


def test_no_tracked_file_points_outside_the_repository():
    out = subprocess.run(["git", "grep", "-n", "-I", "-E", r"(\.\./shared/|shared/[A-Z_]+\.md)", "--", ".",
                          ":!tests/test_readme.py"], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout == "", f"files that point outside the repository (users get the repository alone):\n{out.stdout}"
