"""The kubernetes scheduler's client set-up and error translation.

Every API failure (an HTTP error, an unreachable server, no configuration) becomes one
``KubernetesError`` line that says what went wrong and, where it can, what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

from torchx.specs.api import TorchXError
from torchx.util.modules import import_optional


class KubernetesError(TorchXError):
    """The Kubernetes API refused a request (the message says why and what to do)."""


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """API failures (HTTP errors, unreachable server) become one-line KubernetesErrors; also
    a decorator (``@api_errors()``)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except (ApiException, HTTPError) as e:
        if isinstance(e, ApiException) and e.status is not None:
            reason = f"({e.reason or ''}): {status_message(e)}"
            raise KubernetesError(f"Kubernetes API error {e.status} {reason}") from None
        raise KubernetesError(f"cannot reach the Kubernetes API server: {e}") from None


@contextlib.contextmanager
def tolerating(status: int) -> Iterator[None]:
    """Swallow an API error of ``status`` (e.g. 404: the object is gone, as wanted)."""
    from kubernetes.client.rest import ApiException

    try:
        yield
    except ApiException as e:
        if e.status != status:
            raise


def status_message(e: Any) -> str:
    """The API server's own explanation of an ApiException (its Status ``message``)."""
    try:
        return str(json.loads(e.body).get("message") or e.reason)
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)


def kubeconfig_path() -> str:
    # Read at call time: the client reads $KUBECONFIG once, when it is first imported.
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def load_api_client() -> Any:
    """An ``ApiClient`` from the kubeconfig ($KUBECONFIG, ~/.kube/config), else in-cluster."""
    import_optional("kubernetes", "kubernetes")
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig_path(), client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError) as kube_err:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise KubernetesError(
                f"no Kubernetes configuration found ({kube_err}); set KUBECONFIG or"
                " ~/.kube/config, or run inside a cluster"
            ) from None
    return client.ApiClient(configuration)
