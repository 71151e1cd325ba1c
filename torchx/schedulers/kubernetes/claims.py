"""A keyed submission's claim: a ConfigMap named after the app (``keyed_name``: the key's
token and generation), created before the app's objects. The API server refuses a second
object of one name (409), so of racing submitters one creates the app and the others
re-attach to it (``schedule_named``).

The claim outlives its app: cancel deletes the app's objects but only marks the claim, so
the name stays taken (an old handle never names a new app) and the cancelled app is still
found, CANCELLED, by the key's next lookup (which then counts the next generation). A claim
whose objects are gone without a cancel mark is FAILED once ``CREATE_GRACE_S`` has passed
(its submitter died between the claim and the objects, or they were deleted by hand), so
it never holds the key for good; before that it is SUBMITTED, the objects on their way.
"""

from __future__ import annotations

import re
import time
from typing import Any, Dict, Tuple

from torchx.schedulers.kubernetes.manifests import ANNOTATION_SUBMITTED_AT
from torchx.specs.api import AppState

# time a submitter has from its claim to its app's objects (submitters' clocks)
CREATE_GRACE_S = 60
CANCELLED_KEY = "cancelled"  # in the claim's data, written by cancel
# ``keyed_name``'s tail; an unkeyed app's name ends in a random id that starts with a letter
KEYED_NAME = re.compile(r"-[0-9a-f]{12}-[0-9]+$")


def is_keyed(name: str) -> bool:
    """Whether ``name`` is a keyed app's (only those have a claim, so an account without
    rights on ConfigMaps still runs, reads and cancels unkeyed apps)."""
    return KEYED_NAME.search(name) is not None


def claim_state(claim: Dict[str, Any]) -> Tuple[AppState, str]:
    """The state of a claimed app whose objects are gone (or not created yet)."""
    if (claim.get("data") or {}).get(CANCELLED_KEY):
        return AppState.CANCELLED, "cancelled by torchx cancel"
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    submitted = str(annotations.get(ANNOTATION_SUBMITTED_AT) or "0")
    age = time.time() - int(submitted if submitted.isdigit() else 0) / 1e9
    if age < CREATE_GRACE_S:
        return AppState.SUBMITTED, ""
    return AppState.FAILED, "its job was never created (its submitter stopped) or was deleted"
