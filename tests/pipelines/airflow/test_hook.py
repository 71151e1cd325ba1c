"""``TorchXHook``: torchx's settings from an Airflow Connection (a real one, in Airflow's
metadata database, read by a real ``dag.test`` run), the environment as the fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from tests.pipelines.airflow.test_operator import _dag


@pytest.fixture()
def connection(torchx_env: Path) -> Iterator[str]:
    """A ``torchx`` Connection naming a state directory and a tracker store of its own."""
    from airflow.models.connection import Connection
    from airflow.settings import Session

    conn_id = f"torchx_{torchx_env.name}"[:200]
    extra = {
        "torchx_home": str(torchx_env / "from_connection"),
        "trackers": {"mlflow": f"sqlite:///{torchx_env / 'connection_mlflow.db'}"},
        "cfg": {"local_cwd": {"prepend_cwd": True}},
    }
    with Session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="torchx", extra=json.dumps(extra)))
        session.commit()
    try:
        yield conn_id
    finally:
        with Session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()
            session.commit()


def test_a_stage_keeps_its_state_where_the_connection_says(
    torchx_env: Path, connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``TORCHX_HOME`` and no trackers in the environment: the job's state and its
    tracker run land where the Connection says (without it, under ``$HOME/.torchx``)."""
    from torchx.pipelines.airflow.hook import TorchXHook

    monkeypatch.delenv("TORCHX_HOME")
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.setenv("HOME", str(torchx_env / "fallback"))
    dag = _dag(
        "hook_home",
        component="utils.sh",
        component_args=["echo", "hi"],
        poll_interval=0.2,
        torchx_conn_id=connection,
    )
    dag_run = dag.test()
    assert str(dag_run.state).endswith("success"), dag_run.state
    apps = list((torchx_env / "from_connection" / "local_cwd" / "torchx").glob("*/request.json"))
    assert len(apps) == 1, list((torchx_env / "from_connection").rglob("*"))
    assert not (torchx_env / "fallback" / ".torchx" / "local_cwd").exists()
    assert (torchx_env / "connection_mlflow.db").is_file()  # the Connection's tracker
    # as the listener's process reads it: with the scheduler's context (its database)
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    with TorchXHook(connection).runner() as runner:  # what the sensor gets: the same
        listed = runner.list("local_cwd")
    assert [a.state.name for a in listed] == ["SUCCEEDED"]


def test_settings_from_a_connection() -> None:
    from torchx.pipelines.airflow.hook import TorchXSettings, settings_from

    settings = settings_from(
        {
            "torchx_home": "/shared/torchx",
            "cfg": {"slurm": {"partition": "gpu", "time": "1:00:00"}},
            "trackers": {"mlflow": "https://mlflow.example:5000", "fsspec": "/tmp/t"},
        },
        "ann",
        "p@ss:word",
    )
    assert settings.torchx_home == "/shared/torchx"
    # MLflow's client takes credentials in the URI; other configs are kept as they are
    assert settings.trackers == {
        "mlflow": "https://ann:p%40ss%3Aword@mlflow.example:5000",
        "fsspec": "/tmp/t",
    }
    assert settings.cfg_for("slurm", {"time": "2:00:00"}) == {
        "partition": "gpu",
        "time": "2:00:00",  # the operator's own cfg wins
    }
    assert settings.cfg_for("local_cwd", None) == {}
    assert settings_from({}, None, None) == TorchXSettings()  # the environment decides
    with pytest.raises(ValueError, match="cfg must map a scheduler"):
        settings_from({"cfg": {"partition": "gpu"}}, None, None)


def test_without_the_default_connection_the_environment_decides(torchx_env: Path) -> None:
    from torchx.pipelines.airflow.hook import TorchXHook, TorchXSettings

    assert TorchXHook().settings == TorchXSettings()
