"""Planted secrets (a password, a token, a URI password, a secret ``--env`` value and a
component's secret arguments) never show in what torchx prints, records or compiles: the
dry run of every scheduler, describe/status/list/log, error lines, MLflow params and tags,
and a compiled KFP pipeline. The real CLI, a real job, a real MLflow sqlite store."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

from torchx.specs.secrets import (
    MASK,
    Masker,
    is_secret_name,
    mask_args,
    mask_env,
    mask_urls,
)

PASSWORD, TOKEN, URI_PASSWORD, ENV_SECRET = (
    "pw-plant-7a1",
    "tok-plant-3c9",
    "up-plant-5d2",
    "ev-plant-8e4",
)
ARG_TOKEN, ARG_PASSWORD = "at-plant-2f6", "ap-plant-9b3"
PLANTED = (PASSWORD, TOKEN, URI_PASSWORD, ENV_SECRET, ARG_TOKEN, ARG_PASSWORD)
TORCHX = [sys.executable, "-m", "torchx.cli.main"]

COMPONENT = textwrap.dedent("""
    import torchx.specs as specs

    def train(data: str, hf_token: str, password: str, env: str = "") -> specs.AppDef:
        \"\"\"A training stage that takes credentials as arguments.

        Args:
            data: the data
            hf_token: a token
            password: a password
            env: K=V pairs
        \"\"\"
        envs = dict(p.split("=", 1) for p in env.split(",") if p)
        envs.update(HUB_TOKEN=hf_token, DB_PASSWORD=password)
        code = "import os; print('token', os.environ['HF_TOKEN'], 'uri', os.environ['DB_URL'])"
        return specs.AppDef("train", [specs.Role(
            "train", ".", entrypoint="python", args=["-c", code, data], env=envs,
            resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        )])
""")


def found(text: str) -> List[str]:
    return [s for s in PLANTED if s in text]


@pytest.fixture
def home(tmp_path: Path) -> Dict[str, str]:
    """A CLI env with MLflow credentials of its own and a tracked sqlite store."""
    (tmp_path / "comp.py").write_text(COMPONENT)
    return {
        **os.environ,
        "TORCHX_HOME": str(tmp_path / "home"),
        "TORCHX_TRACKERS": "mlflow",
        "TORCHX_TRACKER_MLFLOW_CONFIG": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
        "MLFLOW_TRACKING_USERNAME": "alice",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }


def torchx(args: List[str], env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TORCHX, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def stage_args() -> List[str]:
    env = f"HF_TOKEN={ENV_SECRET},DB_URL=postgres://bob:{URI_PASSWORD}@db/x"
    return ["--data", "d", "--hf_token", ARG_TOKEN, f"--password={ARG_PASSWORD}", "--env", env]


def test_sensitive_names_and_url_credentials() -> None:
    for name in (
        "HF_TOKEN HFTOKEN GITHUB_PAT KAGGLE_KEY ACCESSTOKEN PRIVATEKEY AZURE_STORAGE_SAS"
        " DOCKER_AUTH_CONFIG MLFLOW_TRACKING_PASSWORD MLFLOW_TRACKING_TOKEN hf_token apiKey"
        " db_password AWS_SECRET_ACCESS_KEY"
    ).split():
        assert is_secret_name(name), name
    for name in "PATH HOME TOKENIZERS_PARALLELISM max_tokens GIT_AUTHOR_NAME LOCAL_RANK lr".split():
        assert not is_secret_name(name), name
    text = f"http://u:{URI_PASSWORD}@h:99999/x file://u:{PASSWORD}@/x https://{TOKEN}@git/x"
    assert found(mask_urls(text)) == [] and mask_urls("http://h/x") == "http://h/x"
    assert mask_env({"HF_TOKEN": TOKEN, "N": "1"}) == {"HF_TOKEN": MASK, "N": "1"}
    assert found(" ".join(map(str, mask_args(stage_args())))) == []
    assert Masker([TOKEN]).mask(f"Bearer {TOKEN}\r") == f"Bearer {MASK}\r"


@pytest.mark.parametrize(
    "scheduler", ["local_cwd", "local_docker", "slurm", "kubernetes", "aws_batch", "ray"]
)
def test_no_dry_run_shows_a_secret(scheduler: str, home: Dict[str, str], tmp_path: Path) -> None:
    remote = scheduler in ("aws_batch", "kubernetes")
    cfg = ["-cfg", "queue=default,image_repo=r.example/x"] if remote else []
    done = torchx(
        ["run", "--dryrun", "--workspace", "", "-s", scheduler, *cfg, "comp.py:train"]
        + stage_args(),
        home,
        tmp_path,
    )
    assert found(done.stdout + done.stderr) == []
    if scheduler == "aws_batch":  # a secret given in clear is refused: Batch takes ARNs
        assert done.returncode == 1 and "HF_TOKEN" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr[-2000:]
    assert "HF_TOKEN" in done.stdout  # the request was shown


def test_a_tracked_job_shows_and_records_no_secret(home: Dict[str, str], tmp_path: Path) -> None:
    done = torchx(["run", "-s", "local_cwd", "comp.py:train", *stage_args()], home, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"token {MASK} uri postgres://bob:{MASK}@db/x" in done.stdout  # the job's own line
    handle = done.stdout.strip().splitlines()[0]
    shown = done.stdout + done.stderr
    for verb in (["describe", handle], ["status", handle], ["list", "-s", "local_cwd"]):
        out = torchx(verb, home, tmp_path)
        assert out.returncode == 0, out.stderr
        shown += out.stdout + out.stderr
    # another shell, without the submitter's env: the app's own env is what it masks
    bare = {k: v for k, v in home.items() if not k.startswith("MLFLOW_")}
    log = torchx(["log", handle], bare, tmp_path)
    assert "token" in log.stdout
    shown += log.stdout + log.stderr
    assert found(shown) == []

    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        params = db.execute("SELECT key, value FROM params").fetchall()
        tags = db.execute("SELECT key, value FROM tags").fetchall()
    assert any(k == "args" for k, _ in params)
    assert found(repr(params) + repr(tags)) == []


def test_error_lines_show_no_credentials(home: Dict[str, str], tmp_path: Path) -> None:
    fast = {**home, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    cases = [
        {"TORCHX_TRACKER_MLFLOW_CONFIG": f"http://u:{URI_PASSWORD}@127.0.0.1:99999"},
        {"TORCHX_TRACKER_MLFLOW_CONFIG": f"file://u:{URI_PASSWORD}@/x"},
        {
            "TORCHX_TRACKER_MLFLOW_CONFIG": "http://127.0.0.1:9",
            "MLFLOW_TRACKING_TOKEN": f"{TOKEN}\r",
        },
    ]
    for case in cases:
        env = {**fast, **case}
        env.pop("MLFLOW_TRACKING_PASSWORD")
        done = torchx(["run", "-s", "local_cwd", "utils.echo"], env, tmp_path)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert found(done.stderr) == [], done.stderr


def test_a_compiled_kfp_pipeline_carries_no_secret(tmp_path: Path) -> None:
    pytest.importorskip("kfp")
    from torchx import specs
    from torchx.pipelines.kfp import component_from_app
    from torchx.specs.errors import InvalidArgumentError

    app = specs.AppDef(
        "prep", [specs.Role("prep", "img:1", entrypoint="true", env={"HF_TOKEN": ENV_SECRET})]
    )
    with pytest.raises(InvalidArgumentError, match="HF_TOKEN holds a secret"):
        component_from_app(app, trackers={})
    uri = {"mlflow": f"http://u:{URI_PASSWORD}@mlflow:5000"}
    app.roles[0].env = {"N": "1"}
    with pytest.raises(InvalidArgumentError) as e:
        component_from_app(app, trackers=uri)
    assert found(str(e.value)) == []
