"""Kubeconfigs handed over as data (a Secret's value), not as files: read, check, open a client.

Owns: picking the kubeconfig out of a ``v1.Secret`` body (the named key, else ``kubeconfig``,
``config`` or ``value``, else the only key; base64 ``data`` or plain ``stringData``), parsing and
checking it (:func:`parse_kubeconfig`: a mapping with a usable current context, its cluster's
``server`` and its user), the rule that a kubeconfig from data may not make the process run commands
or read its local files (``exec`` / ``auth-provider`` users and ``certificate-authority``,
``client-certificate``, ``client-key``, ``tokenFile`` paths are refused: whoever can write the Secret
would otherwise run code or read files as this process; embed ``*-data`` and ``token`` instead), and
opening a ``kubernetes_asyncio`` ``ApiClient`` from the checked dict. Every refusal is a
:class:`KubeconfigError` whose message says what is wrong, for a status condition.

Must not: know FlexInfer's kinds, make API requests or keep clients (the caller owns and closes them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

#: keys tried, in order, when the Secret reference names none
DEFAULT_KEYS = ("kubeconfig", "config", "value")
_FILE_FIELDS = ("certificate-authority", "client-certificate", "client-key", "tokenFile")


class KubeconfigError(ValueError):
    """The kubeconfig (or the Secret holding it) cannot be used; ``str()`` says why."""


def secret_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    """The value of ``key`` in a Secret body as bytes (``stringData`` plain wins over ``data``, which
    is base64), or None when the Secret has no such key; ValueError (binascii.Error) for bad base64."""
    plain = secret.get("stringData") or {}
    if key in plain:
        return str(plain[key]).encode()
    data = secret.get("data") or {}
    if key not in data:
        return None
    return base64.b64decode(str(data[key]), validate=True)


def secret_value(secret: Mapping[str, Any], key: str | None) -> str:
    """The kubeconfig text in a Secret body: ``key``, else one of :data:`DEFAULT_KEYS`, else the only key."""
    data = dict(secret.get("data") or {})
    plain = dict(secret.get("stringData") or {})
    keys = sorted({*data, *plain})
    if key is None:
        key = next((k for k in DEFAULT_KEYS if k in keys), keys[0] if len(keys) == 1 else None)
        if key is None:
            raise KubeconfigError(f"the Secret has keys {keys or '(none)'}; name one in secretRef.key "
                                  f"(or use one of {', '.join(DEFAULT_KEYS)})")
    try:
        value = secret_bytes(secret, key)
        text = None if value is None else value.decode("utf-8")
    except (binascii.Error, UnicodeError) as e:  # UnicodeError: a stringData value that is no text either
        raise KubeconfigError(f"key {key!r} of the Secret is not base64-encoded UTF-8 text: {e}") from None
    if text is None:
        raise KubeconfigError(f"the Secret has no key {key!r} (keys: {', '.join(keys) or 'none'})")
    return text


def fingerprint(text: str) -> str:
    """A short stable digest of a kubeconfig (to notice a changed Secret without keeping its text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _named(cfg: Mapping[str, Any], section: str, name: str) -> Mapping[str, Any]:
    for entry in cfg.get(section) or ():
        if isinstance(entry, Mapping) and entry.get("name") == name:
            inner = entry.get(section[:-1])
            if not isinstance(inner, Mapping):
                raise KubeconfigError(f"{section} entry {name!r} has no {section[:-1]!r} mapping")
            return inner
    raise KubeconfigError(f"no {section[:-1]} named {name!r} in the kubeconfig")


def parse_kubeconfig(text: str) -> dict[str, Any]:
    """The kubeconfig as a dict, checked (see the module docstring); raises :class:`KubeconfigError`."""
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KubeconfigError(f"the kubeconfig is not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise KubeconfigError("the kubeconfig is not a mapping (apiVersion: v1, kind: Config, ...)")
    contexts = [c for c in cfg.get("contexts") or () if isinstance(c, Mapping)]
    current = cfg.get("current-context") or (contexts[0].get("name") if len(contexts) == 1 else None)
    if not current:
        raise KubeconfigError("the kubeconfig has no current-context (and not exactly one context)")
    ctx = _named(cfg, "contexts", str(current))
    cluster = _named(cfg, "clusters", str(ctx.get("cluster")))
    if not isinstance(cluster.get("server"), str) or not cluster["server"].startswith(("https://", "http://")):
        raise KubeconfigError(f"cluster {ctx.get('cluster')!r} of the kubeconfig has no http(s) server URL")
    user = _named(cfg, "users", str(ctx.get("user"))) if ctx.get("user") else {}
    for bad in ("exec", "auth-provider"):
        if bad in user:
            raise KubeconfigError(f"user {ctx.get('user')!r} uses {bad!r}: a kubeconfig from a Secret may not "
                                  "run commands; embed a token or client-certificate-data")
    for section in (cluster, user):
        for f in _FILE_FIELDS:
            if section.get(f):
                raise KubeconfigError(f"{f!r} names a local file; embed the content as {f}-data instead"
                                      if f != "tokenFile" else "'tokenFile' names a local file; embed 'token'")
    cfg["current-context"] = current
    return cfg


def server_of(cfg: Mapping[str, Any]) -> str:
    """The API server URL of the current context of a checked kubeconfig."""
    ctx = _named(cfg, "contexts", str(cfg["current-context"]))
    return str(_named(cfg, "clusters", str(ctx.get("cluster")))["server"])


async def open_client(cfg: Mapping[str, Any]) -> Any:
    """A ``kubernetes_asyncio.client.ApiClient`` for a checked kubeconfig; the caller closes it."""
    from kubernetes_asyncio import config

    try:
        return await config.new_client_from_config_dict(dict(cfg))
    except (config.ConfigException, ValueError, TypeError, KeyError) as e:
        raise KubeconfigError(f"the kubeconfig cannot be loaded: {e}") from None
