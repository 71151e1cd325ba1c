"""torchx's state directories on a shared machine: one another user can write is refused
(as ssh refuses a group-writable ``~/.ssh``), what torchx creates is 0700 whatever the
umask, and a symlink planted where a file is written aside never redirects the write."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Iterator

import pytest

from torchx.util.paths import UnsafeStateRootError, state_dir, torchx_home, write_private

NOBODY = 65534


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (0o777, "writable by others (mode 0777)"),
        (0o703, "writable by others (mode 0703)"),
        (0o770, "writable by its group (mode 0770)"),
    ],
)
def test_a_home_others_can_write_is_refused_with_the_fix(
    tmp_path: Path, mode: int, said: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(mode)
    with pytest.raises(UnsafeStateRootError) as e:
        torchx_home(home)
    assert str(e.value) == (
        f"refusing {home}: it is {said}; chmod go-w {home},"
        " or set TORCHX_HOME to a directory of your own"
    )
    assert isinstance(e.value, PermissionError)


def test_a_home_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to nobody")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    with pytest.raises(UnsafeStateRootError, match=r"it is owned by nobody, not by you \(root\)"):
        torchx_home(home)


@pytest.mark.parametrize("bad", ["local_cwd", "local_cwd/s"])
def test_each_existing_level_below_home_is_checked(tmp_path: Path, bad: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)  # readable by others is fine, as for ~/.ssh
    assert state_dir("local_cwd", "s", given=home) == home / "local_cwd" / "s"
    assert list(home.iterdir()) == []  # a reader creates nothing below the root
    (home / "local_cwd" / "s").mkdir(parents=True, mode=0o700)
    assert state_dir("local_cwd", "s", given=home) == home / "local_cwd" / "s"
    (home / bad).chmod(0o777)
    with pytest.raises(UnsafeStateRootError, match=f"refusing {home / bad}: "):
        state_dir("local_cwd", "s", given=home)


def test_a_new_home_and_its_parents_are_0700_whatever_the_umask(
    tmp_path: Path, umask0: None
) -> None:
    home = tmp_path / "a" / "b" / "home"
    assert torchx_home(home) == home
    assert [_mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", home)] == [0o700] * 3
    write_private(home / "cache" / "deep" / "f.json", "{}")
    assert _mode(home / "cache") == _mode(home / "cache" / "deep") == 0o700
    assert _mode(home / "cache" / "deep" / "f.json") == 0o600


def test_a_symlink_planted_at_a_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "state" / "f.json"
    target.parent.mkdir(mode=0o700)
    # the name the file used to be written aside under, before the rename
    planted = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    planted.symlink_to(victim)
    write_private(target, "new")
    assert victim.read_text() == "precious"
    assert target.read_text() == "new" and not target.is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(["f.json", planted.name])
