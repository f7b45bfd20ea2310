"""What the scripts that write a page of docs/ share: write it, or with ``--check`` say whether it is current.

    sys.exit(generated_page.main(sys.argv[1:], PAGE, render, "the CLI", "gen_cli_reference"))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str], page: Path, render: Callable[[], str], source: str, script: str) -> int:
    """Write ``page`` as ``render()`` makes it; with ``--check``, exit status 1 when the committed page differs
    from ``source`` (what it is read from), naming ``tools/SCRIPT.py`` to run."""
    text = render()
    if argv[:1] == ["--check"]:
        if page.read_text(encoding="utf-8") != text:
            print(f"{page.relative_to(ROOT)} differs from {source}: run python tools/{script}.py")
            return 1
        return 0
    page.parent.mkdir(exist_ok=True)
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0
