"""OpenLineage for ``TorchXOperator``: its inputs and outputs as datasets, and a run facet
linking the torchx app and its tracker (MLflow) run, with the app's resource-hours.

Imported only by the operator's ``get_openlineage_facets_*`` methods, which Airflow's
OpenLineage provider calls when it is installed and configured
(``pip install 'torchx[airflow]'`` brings ``apache-airflow-providers-openlineage``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Type, TypeVar

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    RunFacet,
    dataset_type_dataset,
    dataset_version_dataset,
)

from torchx.pipelines.airflow.lineage import StageDataset, StageLineage, openlineage_name

D = TypeVar("D", InputDataset, OutputDataset)
FACET = "torchx"
_SCHEMA = "https://pytorch.org/torchx/spec/facets/1-1-0/TorchXRunFacet.json#/$defs/TorchXRunFacet"


@attr.define
class TorchXRunFacet(RunFacet):
    """The torchx app a task ran, its tracker run (``trackerRunUrl`` only where a UI is) and
    its requested ``cpuHours`` / ``gpuHours`` (from the run; None without a tracker)."""

    component: Optional[str] = attr.field(default=None)
    scheduler: Optional[str] = attr.field(default=None)
    appHandle: Optional[str] = attr.field(default=None)  # noqa: N815
    tracker: Optional[str] = attr.field(default=None)
    trackerRunId: Optional[str] = attr.field(default=None)  # noqa: N815
    trackerRunUrl: Optional[str] = attr.field(default=None)  # noqa: N815
    cpuHours: Optional[float] = attr.field(default=None)  # noqa: N815
    gpuHours: Optional[float] = attr.field(default=None)  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA


def _facets(dataset: StageDataset) -> Dict[str, Any]:
    facets: Dict[str, Any] = {}
    if dataset.kind:
        facets["datasetType"] = dataset_type_dataset.DatasetTypeDatasetFacet(
            datasetType=dataset.kind.upper(), subType="torchx"
        )
    if dataset.digest:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=dataset.digest
        )
    return facets


def _datasets(kind: Type[D], datasets: Sequence[StageDataset]) -> List[D]:
    out = []
    for d in datasets:
        namespace, name = openlineage_name(d.uri)
        out.append(kind(namespace=namespace, name=name, facets=_facets(d)))
    return out


def operator_lineage(
    component: Optional[str],
    scheduler: Optional[str],
    lineage: Optional[StageLineage],
    declared_inputs: Sequence[str] = (),
    declared_outputs: Sequence[str] = (),
) -> OperatorLineage:
    """``OperatorLineage`` from what the stage recorded plus the task's declared inlets and
    outlets (URIs); ``lineage`` is None before the app was submitted (the START event)."""
    inputs = list(lineage.inputs) if lineage else []
    outputs = list(lineage.outputs) if lineage else []
    for uri in declared_inputs:
        if all(d.uri != uri for d in inputs):
            inputs.append(StageDataset(uri=uri))
    for uri in declared_outputs:
        if all(d.uri != uri for d in outputs):
            outputs.append(StageDataset(uri=uri))
    facet = TorchXRunFacet(
        component=component,
        scheduler=scheduler,
        appHandle=lineage.handle if lineage else None,
        tracker=lineage.tracker if lineage else None,
        trackerRunId=lineage.tracker_run_id if lineage else None,
        trackerRunUrl=lineage.tracker_run_url if lineage else None,
        cpuHours=lineage.cpu_hours if lineage else None,
        gpuHours=lineage.gpu_hours if lineage else None,
    )
    return OperatorLineage(
        inputs=_datasets(InputDataset, inputs),
        outputs=_datasets(OutputDataset, outputs),
        run_facets={FACET: facet},
    )
