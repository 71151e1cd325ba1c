"""Dir workspaces and the Runner's hook, with real files and the real local/slurm schedulers."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import fsspec
import pytest

from torchx import specs
from torchx.schedulers.local_scheduler import LocalScheduler
from torchx.schedulers.ray_scheduler import RayScheduler
from torchx.schedulers.slurm.scheduler import SlurmScheduler
from torchx.workspace import Workspace, WorkspaceError, apply_workspace, walk_workspace
from torchx.workspace.api import PkgInfo
from torchx.workspace.dir_workspace import (
    WORKSPACE_DIR,
    DirWorkspaceMixin,
    JobDirExistsError,
    LocalDirWorkspaceMixin,
    TmpDirWorkspaceMixin,
    workspace_dir,
)


def with_mixin(mixin: type, scheduler: type) -> type:
    """``scheduler`` with ``mixin``: the class itself once its module mixes it in."""
    if issubclass(scheduler, mixin):
        return scheduler
    return type(f"{mixin.__name__}{scheduler.__name__}", (mixin, scheduler), {})


_Local = with_mixin(LocalDirWorkspaceMixin, LocalScheduler)  # local_cwd as it will be
_Slurm = with_mixin(DirWorkspaceMixin, SlurmScheduler)  # slurm as upstream has it
_Tmp = type("_Tmp", (TmpDirWorkspaceMixin, SlurmScheduler), {})


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    """A workspace with a script, a nested file, a symlink and ignored files."""
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "run.sh").write_text("#!/bin/sh\necho from-workspace\n")
    (root / "run.sh").chmod(0o755)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "pkg" / "mod.pyc").write_bytes(b"\0")
    (root / "data" / "big.bin").write_bytes(b"x" * 10)
    (root / "link.sh").symlink_to("run.sh")
    (root / ".torchxignore").write_text("data\n**/*.pyc\n")
    return root


def _app(image: str = "ghcr.io/pytorch/torchx:0.7.0") -> specs.AppDef:
    role = specs.Role(
        name="trainer",
        image=image,
        entrypoint="sh",
        args=["run.sh"],
        resource=specs.resource(cpu=1),
    )
    other = specs.Role(name="other", image=image, entrypoint="echo", resource=specs.resource(cpu=1))
    return specs.AppDef(name="app", roles=[role, other])


def _files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()
    }


KEPT = {".torchxignore", "run.sh", "link.sh", "pkg/mod.py"}


def test_dir_workspace_copies_into_new_job_dir(ws: Path, tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "job1"  # parents are created too
    app = _app()
    build = apply_workspace(_Slurm("test"), app, str(ws), {"job_dir": str(job_dir)})
    assert _files(job_dir) == KEPT
    assert app.roles[0].image == str(job_dir) and app.roles[1].image == _app().roles[1].image
    assert os.stat(job_dir / "run.sh").st_mode & stat.S_IXUSR  # still executable
    assert os.readlink(job_dir / "link.sh") == "run.sh"
    assert build is not None and set(build.files) == KEPT and build.image == str(job_dir)
    assert "copied into" in str(build) and "pkg/mod.py" in str(build)


def test_job_dir_inside_the_workspace_is_not_copied_into_itself(ws: Path) -> None:
    job_dir = ws / "runs" / "job1"  # e.g. -cfg job_dir=runs/job1 with the default workspace
    apply_workspace(_Slurm("test"), _app(), str(ws), {"job_dir": str(job_dir)})
    assert _files(job_dir) == KEPT


def test_dir_workspace_refuses_existing_job_dir(ws: Path, tmp_path: Path) -> None:
    job_dir = tmp_path / "exists"
    job_dir.mkdir()
    with pytest.raises(JobDirExistsError) as e:
        apply_workspace(_Slurm("test"), _app(), str(ws), {"job_dir": str(job_dir)})
    assert isinstance(e.value, FileExistsError) and isinstance(e.value, specs.TorchXError)
    assert 'pass --workspace ""' in str(e.value) and "\n" not in str(e.value)
    assert list(job_dir.iterdir()) == []


def test_dir_workspace_without_job_dir_does_nothing(ws: Path, tmp_path: Path) -> None:
    app = _app()
    build = apply_workspace(_Slurm("test"), app, str(ws), {})
    assert app.roles[0].image == _app().roles[0].image
    assert build is not None and build.files == [] and build.image == build.old_image


def test_no_workspace_or_no_mixin_is_a_noop(ws: Path) -> None:
    app = _app()
    assert apply_workspace(_Slurm("test"), app, None, {"job_dir": "/nonexistent/x"}) is None
    assert apply_workspace(_Slurm("test"), app, "", {"job_dir": "/nonexistent/x"}) is None
    # ray takes no workspace (it has no WorkspaceMixin)
    assert apply_workspace(RayScheduler("test"), app, str(ws), {"job_dir": "/x/y"}) is None
    assert app.roles[0].image == _app().roles[0].image


def test_missing_workspace_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match='is not a directory; pass --workspace ""'):
        apply_workspace(_Local("test"), _app(), str(tmp_path / "nope"), {})
    job_dir = tmp_path / "j"
    with pytest.raises(WorkspaceError):
        apply_workspace(_Slurm("test"), _app(), str(tmp_path / "nope"), {"job_dir": str(job_dir)})
    assert not job_dir.exists()


def test_local_explicit_workspace_runs_in_a_copy(ws: Path, tmp_path: Path) -> None:
    app = _app()
    sched = _Local("test")
    build = apply_workspace(sched, app, f"file://{ws}", {})
    copy = workspace_dir(app.roles[0])
    assert copy is not None and app.roles[0].metadata[WORKSPACE_DIR] == copy
    assert Path(copy).parent == tmp_path / "home" / "workspaces"
    assert Path(copy).name.startswith("trainer-") and app.roles[0].image == copy
    assert _files(Path(copy)) == KEPT and workspace_dir(app.roles[1]) is None
    assert build is not None and set(build.files) == KEPT
    sched.submit_dryrun(app, {})  # the request still builds


@pytest.mark.parametrize("form", ["{cwd}", "file://{cwd}", "."])
def test_local_workspace_equal_to_cwd_runs_in_place(ws: Path, form: str, tmp_path: Path) -> None:
    os.chdir(ws)
    app = _app()
    apply_workspace(_Local("test"), app, form.format(cwd=ws), {})
    assert workspace_dir(app.roles[0]) is None and app.roles[0].image == _app().roles[0].image
    assert not (tmp_path / "home" / "workspaces").exists()


def test_tmp_dir_workspace(ws: Path) -> None:
    app = _app()
    apply_workspace(_Tmp("test"), app, str(ws), {})
    target = Path(app.roles[0].image)
    try:
        assert target.name.startswith("torchx_workspace") and _files(target) == KEPT
    finally:
        import shutil

        shutil.rmtree(target)


def test_multi_project_workspace(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "src").mkdir(parents=True)
    (a / "src" / "main.py").write_text("main")
    b.mkdir()
    (b / "util.py").write_text("util")
    single = tmp_path / "single.txt"
    single.write_text("one file")
    job_dir = tmp_path / "job"
    workspace = Workspace({str(a): "", str(b): "lib", str(single): "conf/single.txt"})
    app = _app()
    apply_workspace(_Slurm("test"), app, workspace, {"job_dir": str(job_dir)})
    assert _files(job_dir) == {"src/main.py", "lib/util.py", "conf/single.txt"}
    missing = Workspace({str(tmp_path / "nope"): "x", str(a): ""})
    with pytest.raises(WorkspaceError, match="'.*nope' does not exist"):
        apply_workspace(_Slurm("test"), _app(), missing, {"job_dir": str(tmp_path / "job2")})


def test_workspace_from_str_and_str() -> None:
    assert Workspace.from_str("/home/me/proj") == Workspace({"/home/me/proj": ""})
    multi = Workspace.from_str("{/a: x, /b: null}")
    assert multi.projects == {"/a": "x", "/b": ""} and not multi.is_unmapped_single_project()
    assert str(multi) == "/a:x;/b" and str(Workspace({"/p": ""})) == "/p"
    with pytest.raises(WorkspaceError):
        Workspace.from_str("[1, 2]")


def test_walk_workspace_over_memory_fs() -> None:
    fs = fsspec.filesystem("memory")
    for path, text in {
        "/mws/a.py": "a",
        "/mws/sub/b.py": "b",
        "/mws/sub/c.log": "c",
        "/mws/.torchxignore": "**/*.log\n",
    }.items():
        with fs.open(path, "w") as f:
            f.write(text)
    try:
        walked = {
            (d.lstrip("/"), tuple(dirs), tuple(files))
            for d, dirs, files in walk_workspace(fs, "/mws")
        }
        assert walked == {
            ("mws", ("sub",), (".torchxignore", "a.py")),
            ("mws/sub", (), ("b.py",)),
        }
    finally:
        fs.rm("/mws", recursive=True)


def test_deprecated_helpers_warn() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PkgInfo(img="i", lazy_overrides={}, metadata=None)
    assert [w.category for w in caught] == [FutureWarning]
