"""A local S3 server (moto's, on the loopback address) for the tests of checkpoints in buckets: the endpoint and
test credentials are set in the environment before any client is made, so no test can reach another host."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def local_s3() -> Iterator[str]:
    """Yields the endpoint of an S3 server on 127.0.0.1, with ``AWS_ENDPOINT_URL`` and test credentials set (and
    every other source of credentials or endpoints turned off) until it stops."""
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            patch.setenv("AWS_ENDPOINT_URL", endpoint)
            forget_clients()
            yield endpoint
        finally:
            server.stop()
            forget_clients()


def forget_clients() -> None:
    """Drops the S3 clients made so far (fsspec keeps one per set of options), so that the next one reads the
    environment afresh."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def new_bucket() -> str:
    """Returns the URL of a new, empty bucket on the local server."""
    import s3fs

    name = f"bucket-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return f"s3://{name}"
