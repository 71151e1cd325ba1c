"""The kubernetes scheduler's client set-up and error translation.

Every API failure (an HTTP error, an unreachable server, no configuration) becomes one
``KubernetesError`` line that says what went wrong and, where it can, what to do.
"""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, ParamSpec, TypeVar, Union

from torchx.specs.api import TorchXError
from torchx.util.modules import import_optional


class KubernetesError(TorchXError):
    """The Kubernetes API refused a request (the message says why and what to do)."""


P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError


def api_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """API failures (HTTP errors, unreachable server) become one-line KubernetesErrors."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except (ApiException, HTTPError) as e:
            raise kubernetes_error(e) from None

    return wrapper


def guarded(lines: Iterator[str]) -> Iterator[str]:
    """``api_errors`` for a generator: errors surface while iterating."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield from lines
    except (ApiException, HTTPError) as e:
        raise kubernetes_error(e) from None


def kubernetes_error(e: Union[ApiException, HTTPError]) -> KubernetesError:
    from kubernetes.client.rest import ApiException

    if isinstance(e, ApiException) and e.status is not None:
        return KubernetesError(
            f"Kubernetes API error {e.status} ({e.reason or ''}): {status_message(e)}"
        )
    return KubernetesError(f"cannot reach the Kubernetes API server: {e}")


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
