"""The files a template build's ``COPY`` steps upload: E2B's upload links, served here.

    uploads = Uploads(data_dir)
    uploads.link(base_url, template_id, files_hash)   {"present": ..., "url": ...}: where the SDK PUTs
    await uploads.receive(request)                     the PUT to that URL: the archive kept
    uploads.path(template_id, files_hash)              the archive kept, or None
    uploads.drop(template_id)                          a build's archives removed (it ended)

E2B answers an upload link (``GET /templates/{id}/files/{hash}``) with a URL the SDK PUTs
the step's files to (a tar, gzipped by default), with no API key: the URL itself is the
credential. Here it is this server's own ``/templates/{id}/files/{hash}`` with a signature
(HMAC-SHA256 under a secret of this server's process, of the template id and the hash), so
only the key that asked for the link can upload there. An archive is written as it comes, to
``<data folder>/e2b-template-files/<template id>/<hash>``, at most
``E2B_TEMPLATE_UPLOAD_BYTES`` (413 past it, nothing kept), and kept until its template's
build ends. ``present`` is true when that template already holds the hash's archive.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import shutil
from pathlib import Path
from urllib.parse import quote

from starlette.requests import Request

from ...limits import E2B_TEMPLATE_UPLOAD_BYTES
from .connect import ConnectError
from .template_steps import FILES_HASH

FOLDER = "e2b-template-files"


class Uploads:
    def __init__(self, data_dir: Path):
        self.folder = Path(data_dir) / FOLDER
        shutil.rmtree(self.folder, ignore_errors=True)  # a stopped server's builds ended with it
        self._secret = secrets.token_bytes(32)

    def _signature(self, template_id: str, files_hash: str) -> str:
        return hmac.new(self._secret, f"{template_id}\0{files_hash}".encode(), hashlib.sha256).hexdigest()

    def path(self, template_id: str, files_hash: str) -> Path | None:
        found = self.folder / template_id / files_hash
        return found if found.is_file() else None

    def link(self, base_url: str, template_id: str, files_hash: str) -> dict[str, object]:
        """E2B's ``TemplateBuildFileUpload``: whether it is there, and where to upload it."""
        if not FILES_HASH.fullmatch(files_hash):
            raise ConnectError("invalid_argument", "hash: the SHA-256 of the step's files, 64 hex digits")
        url = (f"{base_url.rstrip('/')}/templates/{quote(template_id, safe='')}/files/{files_hash}"
               f"?signature={self._signature(template_id, files_hash)}")
        return {"present": self.path(template_id, files_hash) is not None, "url": url}

    async def receive(self, request: Request, template_id: str, files_hash: str) -> None:
        """The PUT of an upload link: its signature checked, its body written as it comes;
        ``unauthenticated`` for a signature this server did not make, ``resource_exhausted``
        (413) past the bound."""
        signature = request.query_params.get("signature", "")
        if not FILES_HASH.fullmatch(files_hash) or not hmac.compare_digest(
                signature, self._signature(template_id, files_hash)):
            raise ConnectError("unauthenticated", "invalid signature: an upload URL this server gave")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > E2B_TEMPLATE_UPLOAD_BYTES:
            raise _too_large()
        folder = self.folder / template_id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = folder / f".{files_hash}.{secrets.token_hex(4)}"
        out = await asyncio.to_thread(open, part, "wb")
        try:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > E2B_TEMPLATE_UPLOAD_BYTES:
                    raise _too_large()
                await asyncio.to_thread(out.write, chunk)
            out.close()
            os.replace(part, folder / files_hash)
        finally:
            out.close()
            part.unlink(missing_ok=True)

    def drop(self, template_id: str) -> None:
        shutil.rmtree(self.folder / template_id, ignore_errors=True)


def _too_large() -> ConnectError:
    return ConnectError("resource_exhausted", f"the upload is larger than {E2B_TEMPLATE_UPLOAD_BYTES} bytes "
                                              "(E2B_TEMPLATE_UPLOAD_BYTES): copy fewer files in one step", 413)
