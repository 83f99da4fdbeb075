"""Where project channels may post: public addresses only, unless the server's admin allows a host.

A channel's URL comes from whoever may edit channels, so it must not reach what only the server can reach:
the name is resolved and every address checked (loopback, private, link-local, the cloud metadata address,
multicast, reserved: refused) before connecting, and the connection goes to the address that was checked
(a DNS answer that changes in between is not followed). Redirects are not followed. ``--notify-allow-hosts``
names hosts, addresses or networks (CIDR) let through anyway ('*': any). The server's own ``--webhook`` is
the operator's and is not checked.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
import urllib.parse

ANY = frozenset({"*"})


class Refused(ValueError):
    """A URL this server will not post to (a ValueError: retrying cannot help)."""


def allowed_hosts(setting: str) -> frozenset:
    return frozenset(h.strip().lower() for h in setting.split(",") if h.strip())


def _allowed(host: str, ip: str, allow: frozenset) -> bool:
    if "*" in allow or host.lower() in allow or ip in allow:
        return True
    addr = ipaddress.ip_address(ip)
    for entry in allow:
        try:
            if "/" in entry and addr in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def public(ip: str) -> bool:
    """Whether an address is one anybody on the internet can reach (what a channel may post to by default)."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return not (
        addr.is_loopback
        or addr.is_private
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
        or str(addr) in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
        or addr in ipaddress.ip_network("100.64.0.0/10")
    )


def address(host: str, port: int, allow: frozenset) -> str:
    """The address to connect to for ``host``: resolved, every answer checked; Refused when one is not allowed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise Refused(f"the host {host!r} does not resolve") from None
    ips = [info[4][0] for info in infos]
    for ip in ips:
        if not public(ip) and not _allowed(host, ip, allow):
            raise Refused(
                f"the host {host!r} resolves to an address channels may not post to (loopback, private, "
                "link-local or metadata); the server's admin can allow it with --notify-allow-hosts"
            )
    return ips[0]


class _Pinned(http.client.HTTPConnection):
    """A connection to an address already checked (the Host header still names the host)."""

    def __init__(self, host, port, ip, timeout):
        super().__init__(host, port, timeout=timeout)
        self.ip = ip

    def connect(self):
        self.sock = socket.create_connection((self.ip, self.port), self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    def __init__(self, host, port, ip, timeout):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.ip = ip

    def connect(self):
        sock = socket.create_connection((self.ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # the certificate of the name


def post(url: str, body: dict, allow: frozenset, timeout: float = 10.0) -> None:
    """One JSON POST to ``url``; Refused for an address not allowed, OSError for a failure or a non-2xx answer."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("the URL must be http(s)://host/...")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ip = parts.hostname if "*" in allow else address(parts.hostname, port, allow)
    conn = (_PinnedTLS if parts.scheme == "https" else _Pinned)(parts.hostname, port, ip, timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        status = conn.getresponse().status
    finally:
        conn.close()
    if 300 <= status < 400:
        raise OSError(f"HTTP {status} (redirects are not followed)")
    if not 200 <= status < 300:
        raise OSError(f"HTTP {status}")
