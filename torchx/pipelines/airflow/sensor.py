"""``TorchXSensor``: wait for an app submitted elsewhere (e.g. ``wait_for_completion=False``)."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.exceptions import AirflowException
from airflow.sdk.bases.sensor import BaseSensorOperator

from torchx.pipelines.airflow.hook import DEFAULT_CONN_ID, TorchXHook
from torchx.specs.api import AppState


class TorchXSensor(BaseSensorOperator):
    """Succeeds when the app SUCCEEDED; fails when it FAILED, was CANCELLED or is unknown."""

    template_fields: Sequence[str] = ("app_handle",)

    def __init__(
        self, *, app_handle: str, torchx_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.app_handle = app_handle
        self.torchx_conn_id = torchx_conn_id  # the TorchXHook Connection with torchx's settings

    def poke(self, context: Any) -> bool:
        with TorchXHook(self.torchx_conn_id).runner() as runner:
            status = runner.status(self.app_handle)
        if status is None:
            raise AirflowException(f"{self.app_handle} is not known to its scheduler")
        if status.state == AppState.SUCCEEDED:
            return True
        if status.is_terminal():
            raise AirflowException(f"torchx app {self.app_handle} {status.error_summary()}")
        return False
