"""The bundled taxonomy's regexes are compiled to check them the first time an install reads that very file (or
after the checking code changed); a broken one is still the loader's one-line error, never a note that it passed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.core import bundled
from servescope.core.categories import bundled_taxonomy
from servescope.core.errors import InputError
from servescope.trace.classify import taxonomy
from servescope.trace.classify.taxonomy_file import _check_regex


@pytest.fixture()
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the package's data folder, its cache in tmp_path, nothing read yet."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "taxonomy.toml").write_bytes((bundled.DATA_DIR / "taxonomy.toml").read_bytes())
    monkeypatch.setattr(bundled, "DATA_DIR", folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bundled_taxonomy.cache_clear()
    taxonomy._bundled.cache_clear()
    yield folder
    bundled_taxonomy.cache_clear()
    taxonomy._bundled.cache_clear()


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def check(text: str, *args: object) -> None:
        seen.append(text)
        _check_regex(text, *args)  # type: ignore[arg-type]

    monkeypatch.setattr("servescope.trace.classify.taxonomy_file._check_regex", check)
    return seen


def test_checked_once_per_file(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _compiles(monkeypatch)
    first = taxonomy._bundled()
    assert len(seen) > 100  # every regex of the rules and precision rules
    taxonomy._bundled.cache_clear()
    bundled_taxonomy.cache_clear()
    seen.clear()
    assert taxonomy._bundled() == first  # the next run: the same taxonomy, no regex compiled to check it
    assert not seen
    text = (data / "taxonomy.toml").read_text()
    (data / "taxonomy.toml").write_text(text + "\n")  # another file: checked again
    taxonomy._bundled.cache_clear()
    bundled_taxonomy.cache_clear()
    taxonomy._bundled()
    assert len(seen) > 100


def test_a_broken_regex_is_never_noted_as_checked(data: Path) -> None:
    text = (data / "taxonomy.toml").read_text()
    (data / "taxonomy.toml").write_text(text.replace("regex = ['(?<!un)quant(?!ile)'", "regex = ['(unclosed'", 1))
    for _ in range(2):
        taxonomy._bundled.cache_clear()
        bundled_taxonomy.cache_clear()
        with pytest.raises(InputError, match="bad regex '\\(unclosed'"):
            taxonomy._bundled()
