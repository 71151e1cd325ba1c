"""``.dockerignore`` rules on real directory trees (the cases from Docker's documentation)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Set

import fsspec
import pytest

from torchx.workspace.api import workspace_files
from torchx.workspace.ignore import IgnoreRules, InvalidIgnorePatternError


def _tree(root: Path, files: Iterable[str], ignore: str, name: str = ".dockerignore") -> None:
    for rel in files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
    (root / name).write_text(ignore)


def _kept(root: Path, name: str = ".dockerignore") -> Set[str]:
    fs = fsspec.filesystem("file")
    return {rel for rel, _ in workspace_files(fs, str(root), name)} - {name}


def test_star_stays_within_one_segment(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        [
            "tempa",
            "temp.txt",
            "a/temporary.txt",
            "a/b/temp.x",
            "a/b/c/temp.y",
            "a/keep.txt",
            "a/temp/inner.txt",
        ],
        "# comment\n*/temp*\n*/*/temp*\ntemp?\n",
    )
    assert _kept(tmp_path) == {"temp.txt", "a/b/c/temp.y", "a/keep.txt"}


def test_reinclude_and_last_match_wins(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        ["README.md", "README-secret.md", "README-other.md", "CHANGES.md", "docs/x.md"],
        "*.md\n!README*.md\nREADME-secret.md\n",
    )
    # *.md is top-level only: docs/x.md stays
    assert _kept(tmp_path) == {"README.md", "README-other.md", "docs/x.md"}


def test_double_star_matches_any_depth(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        ["a.pyc", "x/y/b.pyc", "x/__pycache__/c.py", "x/y.py", "__pycache__/d"],
        "**/*.pyc\n**/__pycache__\n",
    )
    assert _kept(tmp_path) == {"x/y.py"}


def test_excluded_dir_and_reinclude_inside_it(tmp_path: Path) -> None:
    files = ["build/keep.txt", "build/drop.txt", "build/sub/k", "other/keep.txt", "keep.txt"]
    _tree(tmp_path, files, "build\n!build/keep.txt\n")
    assert _kept(tmp_path) == {"build/keep.txt", "other/keep.txt", "keep.txt"}
    # like Docker, an excluded dir is not read unless a ! pattern names a path in it
    (tmp_path / ".dockerignore").write_text("build\n!**/keep.txt\n")
    assert _kept(tmp_path) == {"other/keep.txt", "keep.txt"}


def test_leading_slash_comment_escape_and_class(tmp_path: Path) -> None:
    files = ["secret", "dir/secret", "a#b", "file?", "filex", "log1.txt", "logx.txt", "#x"]
    _tree(tmp_path, files, "/secret\na#b\nfile\\?\nlog[0-9].txt\n  #x\n")
    # '#' starts a comment only at the very start of a line
    assert _kept(tmp_path) == {"dir/secret", "filex", "logx.txt"}


def test_trailing_slash_and_dot_segments_are_cleaned(tmp_path: Path) -> None:
    _tree(tmp_path, ["out/a", "src/out/b", "src/c"], "out/\n./src//out/\n")
    assert _kept(tmp_path) == {"src/c"}


def test_dockerfile_torchx_is_never_left_out(tmp_path: Path) -> None:
    _tree(tmp_path, ["Dockerfile.torchx", "main.py", "sub/Dockerfile.torchx"], "*\n")
    fs = fsspec.filesystem("file")
    assert {rel for rel, _ in workspace_files(fs, str(tmp_path), ".dockerignore")} == {
        "Dockerfile.torchx"
    }


def test_ignore_file_itself_is_kept_unless_excluded(tmp_path: Path) -> None:
    _tree(tmp_path, ["a"], "b\n")
    fs = fsspec.filesystem("file")
    assert {r for r, _ in workspace_files(fs, str(tmp_path), ".dockerignore")} == {
        "a",
        ".dockerignore",
    }
    (tmp_path / ".dockerignore").write_text(".dockerignore\n")
    assert {r for r, _ in workspace_files(fs, str(tmp_path), ".dockerignore")} == {"a"}


@pytest.mark.parametrize(
    "text,needle",
    [("!\n", "lone '!'"), ("log[0-9.txt\n", "bad character class")],
)
def test_bad_patterns_raise_one_line(text: str, needle: str) -> None:
    with pytest.raises(InvalidIgnorePatternError, match=r"^\.torchxignore: .*") as e:
        IgnoreRules(text, source=".torchxignore")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_excluded_checks_parent_directories() -> None:
    rules = IgnoreRules("data\n!data/small.csv\n")
    assert rules.excluded("data/big.csv") and rules.excluded("data/x/y.csv")
    assert not rules.excluded("data/small.csv") and not rules.excluded("src/data")
    assert not rules.skip_dir("data")  # must be read for data/small.csv
    assert IgnoreRules("data\n").skip_dir("data")
