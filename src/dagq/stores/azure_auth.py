"""Where an azure store lives and how to sign in to it.

``azure://ACCOUNT/PREFIX`` names a storage account and a prefix that keeps one
store's container, table and queues apart from another's. How to sign in is chosen
without touching the network:

1. ``AZURE_STORAGE_CONNECTION_STRING``, when it names ACCOUNT (an emulator string
   such as ``UseDevelopmentStorage=true`` names ``devstoreaccount1``);
2. account ``devstoreaccount1``: the Azurite emulator on this machine (or on
   ``DAGQ_AZURITE_HOST``), with its well-known key;
3. any other account: ``azure.identity.aio.DefaultAzureCredential`` (environment,
   managed identity, Azure CLI login, ...) on the public endpoints.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from dagq.errors import ValidationError

#: The emulator's account and its published, well-known key (not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}
AZURITE_HOST_VARIABLE = "DAGQ_AZURITE_HOST"
CONNECTION_STRING_VARIABLE = "AZURE_STORAGE_CONNECTION_STRING"

_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}\Z")
# Container names allow no leading, trailing or doubled hyphen; the prefix is one.
_PREFIX = re.compile(r"^(?=.{3,24}\Z)[a-z0-9]+(?:-[a-z0-9]+)*\Z")

Source = Literal["connection-string", "azurite", "credential"]


@dataclass(frozen=True, slots=True)
class AzureTarget:
    """The account and prefix an ``azure://`` URL names."""

    url: str
    account: str
    prefix: str


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The service URLs of one storage account."""

    blob: str
    queue: str
    table: str


@dataclass(frozen=True, slots=True)
class AzureAuth:
    """How to reach the account: endpoints and a key, a SAS token or a credential.

    With neither ``key`` nor ``sas``, the store signs in with DefaultAzureCredential.
    """

    source: Source
    endpoints: Endpoints
    key: str | None = None
    sas: str | None = None


def parse_azure_url(url: str) -> AzureTarget:
    """Split ``azure://ACCOUNT/PREFIX``; a malformed URL is a ValidationError naming it."""
    parts = urlsplit(url)
    account, prefix = parts.netloc, parts.path.removeprefix("/")
    if parts.scheme != "azure" or parts.query or parts.fragment or "/" in prefix:
        raise ValidationError(
            f"store URL {url!r} is not an azure URL; write azure://ACCOUNT/PREFIX, "
            "e.g. azure://devstoreaccount1/dagq"
        )
    if not _ACCOUNT.match(account):
        raise ValidationError(
            f"store URL {url!r}: account {account!r} is not a storage account name "
            "(3-24 lowercase letters and digits)"
        )
    # Container, queue and table names are lowercase (or case-blind) in Azure, so a
    # prefix is too: ai4s-jobq's tutorial writes 'Tutorial'.
    if not _PREFIX.match(prefix.lower()):
        raise ValidationError(
            f"store URL {url!r}: prefix {prefix!r} must be 3-24 letters, digits and single "
            "hyphens, starting and ending with a letter or digit (case does not matter)"
        )
    prefix = prefix.lower()
    return AzureTarget(url=f"azure://{account}/{prefix}", account=account, prefix=prefix)


def resolve_auth(account: str, environ: Mapping[str, str]) -> AzureAuth:
    """Choose how to sign in to ``account`` (see the module docstring for the order)."""
    text = environ.get(CONNECTION_STRING_VARIABLE, "").strip()
    if text:
        fields = parse_connection_string(text)
        if _names(fields, account):
            return _from_connection_string(fields, account)
    if account == AZURITE_ACCOUNT:
        host = environ.get(AZURITE_HOST_VARIABLE, "").strip() or "127.0.0.1"
        return AzureAuth("azurite", azurite_endpoints(host), key=AZURITE_KEY)
    endpoints = Endpoints(
        *(f"https://{account}.{service}.core.windows.net" for service in AZURITE_PORTS)
    )
    return AzureAuth("credential", endpoints)


def azurite_endpoints(host: str) -> Endpoints:
    """The emulator's endpoints on ``host`` (path-style: the account is in the path)."""
    return Endpoints(
        *(f"http://{host}:{port}/{AZURITE_ACCOUNT}" for port in AZURITE_PORTS.values())
    )


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` as a dict with case-folded keys (values keep their '=')."""
    fields: dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ValidationError(
                f"{CONNECTION_STRING_VARIABLE} is not a connection string: {part!r} has "
                "no '='; copy it from the storage account's 'Access keys' page"
            )
        fields[key.strip().casefold()] = value.strip()
    return fields


def _development(fields: Mapping[str, str]) -> bool:
    return fields.get("usedevelopmentstorage", "").casefold() == "true"


def _names(fields: Mapping[str, str], account: str) -> bool:
    """Does the connection string sign in to ``account``?"""
    if _development(fields):
        return account == AZURITE_ACCOUNT
    if "accountname" in fields:
        return fields["accountname"] == account
    endpoint = fields.get("blobendpoint") or fields.get("queueendpoint") or ""
    parts = urlsplit(endpoint)
    host_account = (parts.hostname or "").split(".")[0]
    path_account = parts.path.strip("/").split("/")[0]
    return account in (host_account, path_account)


def _from_connection_string(fields: Mapping[str, str], account: str) -> AzureAuth:
    if _development(fields):
        return AzureAuth("connection-string", azurite_endpoints("127.0.0.1"), key=AZURITE_KEY)
    protocol = fields.get("defaultendpointsprotocol", "https")
    suffix = fields.get("endpointsuffix", "core.windows.net")
    endpoints = Endpoints(
        *(
            (
                fields.get(f"{service}endpoint") or f"{protocol}://{account}.{service}.{suffix}"
            ).rstrip("/")
            for service in AZURITE_PORTS
        )
    )
    key = fields.get("accountkey")
    sas = fields.get("sharedaccesssignature")
    if key is None and sas is None:
        raise ValidationError(
            f"{CONNECTION_STRING_VARIABLE} names account {account!r} but holds neither "
            "AccountKey nor SharedAccessSignature; unset it to sign in with your Azure login"
        )
    return AzureAuth(
        "connection-string", endpoints, key=key, sas=None if key or sas is None else sas.lstrip("?")
    )
