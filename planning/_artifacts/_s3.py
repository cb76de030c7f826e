"""Blobs in an S3-compatible object store, for clusters: ``S3BlobStore``.

Each blob is the object ``<prefix><digest>`` of one bucket, written with a single ``PUT`` (atomic:
an object is there whole or not at all) whose ``x-amz-content-sha256`` is the blob's digest, so a
server that checks payload hashes (AWS S3 does) refuses bytes that do not match it; every ``GET``
is hashed again here, so a blob changed in the bucket is named, never served. Requests are signed
with AWS Signature Version 4 (path-style URLs, which S3-compatible servers accept), over the
standard library's ``http.client``: no SDK is needed. The credentials are given to the
constructor (from the deployment's settings), never read here from the environment.

Errors: a refused or failed request is ``ArtifactStorageError`` with the operation, the object and
the server's status in one line; a missing object on read is ``ArtifactCorruptError`` ("is
missing"), as with files.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlsplit

from stratagem.planning._artifacts._blobs import blob_digest
from stratagem.planning._artifacts._errors import ArtifactCorruptError, ArtifactStorageError

__all__ = ["S3BlobStore"]

_EMPTY: Final = hashlib.sha256(b"").hexdigest()


def _children(element: ET.Element, name: str) -> list[ET.Element]:
    """The children named ``name``, whatever the namespace (servers differ in theirs)."""
    return [child for child in element if child.tag.rpartition("}")[2] == name]


def _text(element: ET.Element, name: str) -> str:
    found = _children(element, name)
    return (found[0].text or "") if found else ""


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class S3BlobStore:
    """Content-addressed blobs as objects of an S3-compatible bucket (created when missing).

    Args:
        endpoint: The server's URL (``http://127.0.0.1:9000``, ``https://s3.eu-west-1.amazonaws.com``).
        bucket: The bucket.
        access_key: The access key id.
        secret_key: The secret key.
        region: The signing region.
        prefix: The key prefix of the blobs.
        timeout_s: How long one request may take.
    """

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        prefix: str = "blobs/sha256/",
        timeout_s: float = 60.0,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint: {endpoint!r} is not an http(s) URL")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._netloc = parts.netloc
        self.bucket = bucket
        self.prefix = prefix
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._bucket_ready = False

    @property
    def location(self) -> str:
        scheme = "https" if self._https else "http"
        return f"s3 {scheme}://{self._netloc}/{self.bucket}/{self.prefix}"

    # --- requests ------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(self._host, self._port, timeout=self._timeout_s)
            self._local.conn = conn
        return conn

    def _signed(
        self, method: str, path: str, query: dict[str, str], payload_hash: str
    ) -> dict[str, str]:
        now = datetime.now(UTC)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        day = now.strftime("%Y%m%d")
        headers = {
            "host": self._netloc,
            "x-amz-content-sha256": payload_hash,
            "x-amz-date": stamp,
        }
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
        )
        names = sorted(headers)
        canonical = "\n".join(
            [
                method,
                quote(path, safe="/-_.~"),
                canonical_query,
                "".join(f"{n}:{headers[n]}\n" for n in names),
                ";".join(names),
                payload_hash,
            ]
        )
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = _hmac(
            _hmac(_hmac(_hmac(f"AWS4{self._secret_key}".encode(), day), self._region), "s3"),
            "aws4_request",
        )
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return headers

    def _request(
        self,
        method: str,
        key: str = "",
        *,
        query: dict[str, str] | None = None,
        body: bytes = b"",
        payload_hash: str | None = None,
        what: str,
    ) -> tuple[int, bytes, dict[str, str]]:
        path = f"/{self.bucket}" + (f"/{key}" if key else "")
        query = query or {}
        headers = self._signed(
            method, path, query, payload_hash or hashlib.sha256(body).hexdigest()
        )
        if body or method == "PUT":
            headers["content-length"] = str(len(body))
        target = quote(path, safe="/-_.~")
        if query:
            target += "?" + "&".join(
                f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
            )
        for tries in (1, 2):  # a connection the server closed meanwhile is opened once more
            conn = self._connection()
            try:
                conn.request(method, target, body=body or None, headers=headers)
                response = conn.getresponse()
                data = response.read()
                return response.status, data, {k.lower(): v for k, v in response.getheaders()}
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if tries == 2:
                    raise ArtifactStorageError(
                        f"cannot {what} at {self.location}: {exc}", self.location
                    ) from exc
        raise AssertionError("unreachable")

    def _failed(self, what: str, status: int, data: bytes) -> ArtifactStorageError:
        code = ""
        try:
            found = _text(ET.fromstring(data), "Code") if data else ""
            code = f" {found}" if found else ""
        except ET.ParseError:
            pass
        return ArtifactStorageError(
            f"cannot {what} at {self.location}: HTTP {status}{code}", self.location
        )

    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        status, data, _ = self._request("HEAD", what="find the bucket")
        if status == 404:
            status, data, _ = self._request("PUT", what="create the bucket")
            if status not in (200, 409):
                raise self._failed("create the bucket", status, data)
        elif status != 200:
            raise self._failed("reach the bucket", status, data)
        self._bucket_ready = True

    # --- BlobStore -----------------------------------------------------------------------------

    def put(self, digest: str, data: bytes) -> bool:
        self._ensure_bucket()
        if self.has(digest):
            return False
        key = self.prefix + digest
        status, body, _ = self._request(
            "PUT", key, body=bytes(data), payload_hash=digest, what=f"write {key}"
        )
        if status != 200:
            failed = self._failed(f"write {key} ({len(data)} bytes)", status, body)
            raise ArtifactStorageError(f"{failed}; nothing was saved", self.location)
        return True

    def get(self, digest: str) -> bytes:
        self._ensure_bucket()
        key = self.prefix + digest
        status, data, _ = self._request("GET", key, what=f"read {key}")
        if status == 404:
            raise ArtifactCorruptError(digest, self.location + digest, "is missing")
        if status != 200:
            raise self._failed(f"read {key}", status, data)
        if blob_digest(data) != digest:
            raise ArtifactCorruptError(
                digest, self.location + digest, "does not match its digest (corrupted)"
            )
        return data

    def put_file(self, source: Path) -> tuple[str, bool]:
        data = Path(source).read_bytes()
        digest = blob_digest(data)
        return digest, self.put(digest, data)

    def get_file(self, digest: str, target: Path) -> None:
        data = self.get(digest)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{time.time_ns()}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ArtifactStorageError(
                f"cannot write {target}: {exc.strerror or exc}", self.location
            ) from exc

    def has(self, digest: str) -> bool:
        self._ensure_bucket()
        key = self.prefix + digest
        status, data, _ = self._request("HEAD", key, what=f"look up {key}")
        if status == 200:
            return True
        if status == 404:
            return False
        raise self._failed(f"look up {key}", status, data)

    def delete(self, digest: str) -> None:
        self._ensure_bucket()
        key = self.prefix + digest
        status, data, _ = self._request("DELETE", key, what=f"delete {key}")
        if status not in (200, 204, 404):
            raise self._failed(f"delete {key}", status, data)

    def blobs(self) -> Iterator[tuple[str, float]]:
        self._ensure_bucket()
        token = ""
        while True:
            query = {"list-type": "2", "prefix": self.prefix}
            if token:
                query["continuation-token"] = token
            status, data, _ = self._request("GET", query=query, what="list the blobs")
            if status != 200:
                raise self._failed("list the blobs", status, data)
            root = ET.fromstring(data)
            for item in _children(root, "Contents"):
                modified = _text(item, "LastModified").replace("Z", "+00:00")
                when = datetime.fromisoformat(modified).timestamp()
                yield _text(item, "Key").removeprefix(self.prefix), when
            token = _text(root, "NextContinuationToken")
            if _text(root, "IsTruncated") != "true" or not token:
                return

    def sweep_temporary(self, older_than: float) -> int:
        return 0  # a PUT is whole or absent: nothing temporary is left in a bucket

    def corrupt_for_tests(self, digest: str, data: bytes) -> None:
        """Overwrite a blob's object with other bytes (tests: a bucket changed behind us)."""
        key = self.prefix + digest
        status, body, _ = self._request("PUT", key, body=data, what=f"write {key}")
        if status != 200:
            raise self._failed(f"write {key}", status, body)
