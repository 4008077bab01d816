"""Which certificate authorities ``https://`` links trust (issue 20; the Rust SDK's ``ca_file``).

Verification is always on. Without a CA file the system's usual roots are trusted (httpx's
default, certifi); with one, only the CAs in that PEM file are, as a private deployment's CA
needs. A file that cannot be read or holds no certificate stops the start with a
:class:`~agent_reach.errors.ConfigError` naming it, never a silent fallback to other roots.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

#: The environment variable an agent or client reads its CA file from when ``ca_file=`` is not given.
CA_FILE_ENV = "AGENT_REACH_CA_FILE"

PathLike = str | os.PathLike[str]


def ca_file_from(ca_file: PathLike | None) -> PathLike | None:
    """``ca_file``, else ``$AGENT_REACH_CA_FILE`` when set and not empty."""
    return ca_file if ca_file is not None else (os.environ.get(CA_FILE_ENV) or None)


def problems(ca_file: PathLike | None) -> list[str]:
    """What is wrong with ``ca_file`` (empty: nothing, or no file given)."""
    if ca_file is None:
        return []
    path = Path(ca_file)
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as error:
        return [f"ca_file {path}: cannot read it ({error.strerror or error})"]
    if "-----BEGIN CERTIFICATE-----" not in text:
        return [f"ca_file {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"]
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as error:
        return [f"ca_file {path} is not a valid PEM certificate bundle: {error}"]
    return []


def verify(ca_file: PathLike | None) -> ssl.SSLContext | bool:
    """httpx's ``verify=``: ``True`` (the default roots) or a context trusting only ``ca_file``'s CAs.

    Call :func:`problems` first; this raises ``OSError``/``ssl.SSLError`` on a bad file.
    """
    if ca_file is None:
        return True
    # With cafile given, create_default_context loads only that file (no system roots),
    # and keeps hostname checking and CERT_REQUIRED on.
    return ssl.create_default_context(cafile=str(Path(ca_file)))
