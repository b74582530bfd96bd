"""Who may ask what: the Host header against the allowed names (DNS rebinding), and the write routes'
checks (the token; no cross-origin browser request: a web page the operator visits cannot add rows).

A browser names the page that sent a request in ``Origin`` and, in current browsers, says whether it is
another site's in ``Sec-Fetch-Site``; a client such as curl or httpx sends neither and is let through
(with the token, where one is set).
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header without its port (``[::1]:8000`` -> ``::1``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_refusal(host_header: str | None, allowed: tuple[str, ...] | None) -> str | None:
    """Why a request's ``Host`` is refused (None: allowed; ``allowed`` None: any host)."""
    if allowed is None:
        return None
    name = host_name(host_header or "")
    if name in allowed:
        return None
    return (
        f"the Host {host_header!r} is not one this server answers ({', '.join(allowed)}); reach it by one "
        f"of those names, or start it with --allowed_hosts naming this one."
    )


def write_refusal(headers, token: str | None) -> tuple[int, str] | None:
    """(status, why) when a write request (``/add``, ``/model``) is refused, else None."""
    if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
        return 403, "a cross-site browser request may not change the gallery; send it from a client, not a web page."
    origin = headers.get("origin")
    if origin is not None:
        origin_host = urlsplit(origin).netloc.lower()
        if origin_host != headers.get("host", "").lower():
            return 403, f"a request from the web page {origin!r} may not change the gallery; send it from a client."
    if token is not None:
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        # the scheme is case-insensitive (RFC 7235): clients that send "bearer" were refused
        if not (hmac.compare_digest(given.strip().encode(), token.encode()) and scheme.lower() == "bearer"):
            return 401, "this route needs the server's token: send 'Authorization: Bearer TOKEN'."
    return None
