"""Documents as block blobs in the store's container, under ``documents/``.

Conditional writes use the blob ETag: ``if_match`` sends If-Match (412 when the blob
moved on, 404 or 412 when it is gone: both are a conflict), ``if_none_match`` sends
If-None-Match: * (409 BlobAlreadyExists, or 412: both mean "exists"). A write never
replaces a version it was not told about.

A put whose condition must be known good before a batch writes anything else (see
:class:`~dagq.stores.azure.PhasedCommitter`) is checked with one HEAD, unless this
process itself wrote or read the version the condition names (:class:`SeenVersions`):
the coordinator's state headers, written only by the lease holder, are checked
without a request. A version another process replaced meanwhile still fails the put.

Listing with ``start_after`` filters on this side: Azure has no "list after this
name" that the emulator understands, so paging through a long prefix re-reads the
names before the page.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from dagq.stores.azure_service import AzureService, Clients
from dagq.stores.base import Document
from dagq.stores.common import check_limit, check_put, conflict

#: Where documents live inside the container (dead letters and leases live beside).
DOCUMENTS = "documents/"
_LIST_PAGE = 5000
_CONDITION_FAILED = (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError)


class SeenVersions:
    """The etag each document had when this process last wrote or read it (bounded:
    the least recently seen are forgotten first)."""

    def __init__(self, *, max_keys: int = 100_000) -> None:
        self._etags: OrderedDict[str, str] = OrderedDict()
        self._max_keys = max_keys

    def saw(self, key: str, etag: str) -> None:
        """``key`` was at ``etag`` a moment ago."""
        self._etags[key] = etag
        self._etags.move_to_end(key)
        while len(self._etags) > self._max_keys:
            self._etags.popitem(last=False)

    def forget(self, key: str) -> None:
        """Nothing is known of ``key`` any more (deleted, or a condition failed)."""
        self._etags.pop(key, None)

    def at(self, key: str, etag: str) -> bool:
        """Was ``key`` at ``etag`` when this process last saw it?"""
        return self._etags.get(key) == etag


class AzureDocuments:
    """Versioned documents in Blob Storage; the etag is the blob's ETag."""

    def __init__(self, service: AzureService) -> None:
        self._service = service
        self.seen = SeenVersions()

    async def get(self, key: str) -> Document | None:
        async def download(c: Clients) -> Document:
            stream = await self._service.blob_client(c, DOCUMENTS + key).download_blob()
            data = await stream.readall()
            return Document(data, str(stream.properties.etag))

        try:
            doc = await self._service.call("blob.get", download, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:
            self.seen.forget(key)
            return None
        self.seen.saw(key, doc.etag)
        return doc

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        check_put(if_match, if_none_match)

        async def upload(c: Clients) -> str:
            blob = self._service.blob_client(c, DOCUMENTS + key)
            if if_none_match:
                result = await blob.upload_blob(bytes(data), overwrite=False)
            elif if_match is not None:
                result = await blob.upload_blob(
                    bytes(data),
                    overwrite=True,
                    etag=if_match,
                    match_condition=MatchConditions.IfNotModified,
                )
            else:
                result = await blob.upload_blob(bytes(data), overwrite=True)
            return str(result["etag"])

        conditional = if_none_match or if_match is not None
        try:
            etag = await self._service.call(
                "blob.put", upload, expect=_CONDITION_FAILED if conditional else ()
            )
        except _CONDITION_FAILED as exc:
            self.seen.forget(key)
            raise conflict(key, if_match) from exc
        self.seen.saw(key, etag)
        return etag

    async def check(self, key: str, *, if_match: str | None, if_none_match: bool) -> None:
        """Raise ConflictError now if a conditional put of ``key`` would fail (one HEAD,
        none when this process saw ``key`` at ``if_match`` itself)."""
        if if_match is not None and self.seen.at(key, if_match):
            return
        etag = await self._etag(key)
        if (if_none_match and etag is not None) or (if_match is not None and etag != if_match):
            raise conflict(key, if_match)

    async def _etag(self, key: str) -> str | None:
        """The current etag of a document, or None if there is none (one HEAD)."""

        async def head(c: Clients) -> str:
            properties = await self._service.blob_client(c, DOCUMENTS + key).get_blob_properties()
            return str(properties.etag)

        try:
            etag = await self._service.call("blob.head", head, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:
            self.seen.forget(key)
            return None
        self.seen.saw(key, etag)
        return etag

    async def delete(self, key: str, *, if_match: str | None = None) -> bool:
        async def remove(c: Clients) -> None:
            blob = self._service.blob_client(c, DOCUMENTS + key)
            if if_match is None:
                await blob.delete_blob()
            else:
                await blob.delete_blob(etag=if_match, match_condition=MatchConditions.IfNotModified)

        self.seen.forget(key)
        try:
            await self._service.call(
                "blob.delete", remove, expect=(ResourceNotFoundError, ResourceModifiedError)
            )
        except ResourceNotFoundError:
            return False
        except ResourceModifiedError as exc:
            # Azure answers 412 for a missing blob too: only an existing one conflicts.
            if await self._etag(key) is None:
                return False
            raise conflict(key, if_match) from exc
        return True

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[str]:
        check_limit(limit)
        keys: list[str] = []
        if limit == 0:
            return keys
        pages = self._service.pages(
            "blob.list",
            lambda c: c.container.list_blobs(
                name_starts_with=DOCUMENTS + prefix, results_per_page=_LIST_PAGE
            ),
        )
        async with contextlib.aclosing(pages):
            async for page in pages:
                for blob in page:
                    key = str(blob.name).removeprefix(DOCUMENTS)
                    if start_after is None or key > start_after:
                        keys.append(key)
                if limit is not None and len(keys) >= limit:
                    break
        keys.sort()
        return keys if limit is None else keys[:limit]
