"""What is secret, and how torchx shows text that may hold a secret (docs/security.md).

The one place that decides: values under a sensitive name (an env var, a component or
orchestrator argument, a nested key), the password or token in any URL's userinfo, and
values a caller registered with a ``Masker``. Everything torchx prints, logs or records
goes through ``mask_env``/``mask_value``/``mask_args`` or a ``Masker``. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Set,
    Union,
    runtime_checkable,
)

MASK = "***"

# A name is sensitive when, upper-cased with camelCase split and every non-alphanumeric run
# read as ``_``, it matches: Airflow's default sensitive field names, plus the compounds a
# team's env holds (``HFTOKEN``, ``GITHUB_PAT``, ``KAGGLE_KEY``, ``AZURE_STORAGE_SAS``,
# ``DOCKER_AUTH_CONFIG``, ``PRIVATEKEY``). ``TOKEN`` but not ``TOKENS``/``TOKENIZER``
# (``max_tokens``, ``TOKENIZERS_PARALLELISM`` are ordinary settings); ``AUTH`` but not
# ``AUTHOR`` (``GIT_AUTHOR_NAME``).
_SENSITIVE = re.compile(
    r"PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIAL|PRIVATE_?\w*KEY|API_?KEY|ACCESS_?KEY"
    r"|SERVICE_?KEY|SERVICE_ACCOUNT|KEYFILE|BEARER|CONNECTION_STRING|WEBHOOK_URL|PROX(Y|IES)"
    r"|TOKEN(?!S|IZ)|AUTH(?!OR)|(^|_)(KEY|PAT|SAS|DSN)($|_)"
)
# a URL's userinfo: ``scheme://user:password@`` or ``scheme://token@``
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<info>[^/\s@?#'\"]+)@")
# values never worth masking in free text: they would hide ordinary words
_TOO_COMMON = {"true", "false", "none", "null", "yes", "no", "on", "off", MASK}
MIN_MASKED_LENGTH = 5


def _words(name: str) -> str:
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words)
    return re.sub(r"[^A-Za-z0-9]+", "_", words).upper()


def is_secret_name(name: str) -> bool:
    """Does a value under ``name`` (an env var, an argument, a key) hold a secret?"""
    return bool(name) and _SENSITIVE.search(_words(name)) is not None


def mask_urls(text: str) -> str:
    """``text`` with the password (``user:***@``) or token (``***@``) of every URL masked."""

    def one(m: re.Match[str]) -> str:
        user, colon, _ = m["info"].partition(":")
        return f"{m['head']}{user}:{MASK}@" if colon else f"{m['head']}{MASK}@"

    return _USERINFO.sub(one, text) if "@" in text else text


def url_secrets(text: str) -> List[str]:
    """The passwords and tokens in the userinfo of the URLs in ``text``."""
    found = []
    for m in _USERINFO.finditer(text):
        user, colon, password = m["info"].partition(":")
        found.append(password if colon else user)
    return [s for s in found if s]


def mask_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` as torchx shows it: a sensitive name's value masked, URL credentials masked."""
    return {k: MASK if is_secret_name(k) else mask_urls(str(v)) for k, v in env.items()}


def secret_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The entries of ``env`` that hold a secret: a sensitive name, or URL credentials."""
    return {k: v for k, v in env.items() if is_secret_name(k) or url_secrets(str(v))}


def env_secrets(env: Mapping[str, str]) -> List[str]:
    """The secret values in ``env``: a sensitive name's whole value, and the credentials in
    the URLs of the others (what a ``Masker`` hides wherever they appear)."""
    found: List[str] = []
    for name, value in env.items():
        found += [str(value)] if is_secret_name(name) else url_secrets(str(value))
    return found


@runtime_checkable
class _PydanticModel(Protocol):
    """A pydantic (v2) model (Prefect's params), without importing pydantic."""

    def model_dump(self) -> Dict[str, Any]: ...


def mask_value(name: str, value: object) -> object:
    """``value`` (under ``name``) as torchx shows it: masked whole under a sensitive name;
    else nested mappings, lists, dataclasses and pydantic models masked key by key, and
    URL credentials in strings masked."""
    if is_secret_name(name):
        return MASK
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, _PydanticModel):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {k: mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_value("", v) for v in value]
    return mask_urls(value) if isinstance(value, str) else value


_ENV_FLAGS = ("--env", "-env", "--e", "-e")


def _mask_pairs(text: str, found: List[str]) -> str:
    """``K=V,K2=V2`` with each sensitive name's value masked (a ``,`` inside a value stays
    with it, as components parse ``--env``); the masked values are added to ``found``."""
    out: List[str] = []
    masking = False
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            masking = is_secret_name(name)
            if masking:
                found.append(value)
            out.append(f"{name}={MASK}" if masking else _urls(part, found))
        elif masking:
            found[-1] += "," + part  # the rest of a masked value
        else:
            out.append(_urls(part, found))
    return ",".join(out)


def _urls(text: str, found: List[str]) -> str:
    found += url_secrets(text)
    return mask_urls(text)


def mask_args(
    args: Union[List[str], Dict[str, Any]], found: Optional[List[str]] = None
) -> Union[List[str], Dict[str, Any]]:
    """A component's arguments as torchx shows them: the value of a sensitive argument
    (``--hf_token X``, ``--password=Y``, ``{"hf_token": ...}``) and of a sensitive
    ``--env`` name masked; URL credentials masked. The values it masked are added to
    ``found`` (what a ``Masker`` must hide wherever else they appear)."""
    found = [] if found is None else found
    if isinstance(args, dict):
        out = {k: mask_value(str(k), v) for k, v in args.items()}
        found += [str(v) for k, v in args.items() if is_secret_name(str(k))]
        env = args.get("env")
        if isinstance(env, Mapping):
            out["env"] = mask_env(env)
            found += env_secrets(env)
        elif isinstance(env, str):
            out["env"] = _mask_pairs(env, found)
        return out
    masked: List[str] = []
    follows: str = ""  # the flag the previous argument was, when it takes this value
    for arg in (str(a) for a in args):
        flag, eq, value = arg.partition("=")
        if follows in _ENV_FLAGS:
            arg = _mask_pairs(arg, found)
        elif follows and is_secret_name(follows.lstrip("-")):
            found.append(arg)
            arg = MASK
        elif arg.startswith("-") and eq and flag in _ENV_FLAGS:
            arg = f"{flag}={_mask_pairs(value, found)}"
        elif arg.startswith("-") and eq and is_secret_name(flag.lstrip("-")):
            found.append(value)
            arg = f"{flag}={MASK}"
        else:
            arg = _urls(arg, found)
        follows = arg if arg.startswith("-") and "=" not in arg else ""
        masked.append(arg)
    return masked


class Masker:
    """The secret values one caller handles (a CLI invocation, an operator's task), masked
    wherever they appear in a text, and every URL's credentials. Each caller keeps its own:
    nothing process-wide."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: Set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        for value in values:
            self.add(value)

    def add(self, value: object) -> None:
        """Mask ``value`` from now on (too short or too common a value is not masked in free
        text: it would hide ordinary words; its own field is still masked by name)."""
        text = str(value or "").strip()
        if len(text) < MIN_MASKED_LENGTH or text.lower() in _TOO_COMMON:
            return
        if text not in self._values:
            self._values.add(text)
            self._pattern = None

    def add_env(self, env: Mapping[str, str]) -> None:
        """The secret values of ``env`` (sensitive names' values, URL credentials)."""
        for value in env_secrets(env):
            self.add(value)

    @property
    def values(self) -> Set[str]:
        return set(self._values)

    def mask(self, text: str) -> str:
        """``text`` with every registered value and every URL's credentials masked."""
        if self._values:
            if self._pattern is None:
                ordered = sorted(self._values, key=len, reverse=True)  # longest first
                self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
            text = self._pattern.sub(MASK, text)
        return mask_urls(text)
