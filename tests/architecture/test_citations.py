"""Code cites what a reader can open: an engine source line (file:line with its version), a measurement, a
test. Not this project's issue numbers (the word, then a number or "4x") nor its design file, which a reader of
the code (a user's installed wheel, a contributor's checkout) cannot see; other projects' public issue and
PR numbers stay (SGLang's, vLLM's, SpecForge's: four digits and more, the project named within two lines).

Checked over every product module, the top-level modules and every test module (``tests/`` included).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("eagle3", "tracer", "replay", "demo", "tui", "demo_models", "tests")
#: an issue cited by number: the word (or its plural) then "33", "44-46", "-13", "#7" or "3x"
ISSUE = re.compile(r"\bissues?[ -]#?(\d+x?)\b", re.IGNORECASE)
DESIGN = "DESIGN" + ".md"
#: names that make a long issue number another project's (within the line or the one before)
OTHERS = ("sglang", "vllm", "specforge", "speculators", "sgl-project/", "vllm-project/", "github.com/")


def _theirs(number: str, near: str) -> bool:
    """Whether issue ``number`` is another project's: four digits or more, a project named ``near`` it."""
    return number.isdigit() and len(number) >= 4 and any(o in near.lower() for o in OTHERS)


def project_citations(root: Path) -> dict[str, list[int]]:
    """module path -> lines that cite this project's issues or its design file, over the product packages,
    the top-level modules and ``tests/`` under ``root``."""
    paths = [p for pkg in PRODUCT for p in sorted((root / pkg).rglob("*.py"))] + sorted(root.glob("*.py"))
    out: dict[str, list[int]] = {}
    for path in paths:
        lines = path.read_text().splitlines()
        bad = [i for i, line in enumerate(lines, 1)
               if DESIGN in line or any(not _theirs(m.group(1), lines[max(i - 2, 0)] + line)
                                        for m in ISSUE.finditer(line))]
        if bad:
            out[path.relative_to(root).as_posix()] = bad
    return out


def test_no_module_or_test_cites_a_project_issue_or_the_design_file():
    assert project_citations(ROOT) == {}


def test_the_check_finds_project_issues_and_keeps_other_projects_numbers(tmp_path):
    issue = "issue"  # spelled apart so that this file passes its own check
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "sub" / "test_x.py").write_text(
        f'"""A test ({issue} 22 item 5)."""\n'
        f"# SGLang before PR 28496 mixed rows ({issue} 26163)\n"
        "# vLLM's extract_hidden_states\n"
        f"# reads the wrong column ({issue} 56442, open)\n"
        f"# what {issue}s 44-46 asked\n"
        f"# as in the {DESIGN[:-3]}.md\n")
    (tmp_path / "tui").mkdir()
    (tmp_path / "tui" / "app.py").write_text(f"X = 1  # ({issue} 3x)\nY = 2  # {issue} 12345 with no project named\n")
    (tmp_path / "top.py").write_text(f'"""Plain zarr ({issue}-13)."""\n')
    assert project_citations(tmp_path) == {"tests/sub/test_x.py": [1, 5, 6], "tui/app.py": [1, 2], "top.py": [1]}
