"""Remote fetches for `--allow-remote-media`: http(s) only, every hop's host resolved and
checked before connecting, and the connection pinned to the address that was checked (so DNS
cannot swap in a private one between check and use)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import unicodedata
import urllib.parse

import httpx

from respd.service.media.errors import bad, too_many_bytes

MAX_REDIRECTS = 5


def _blocked(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return (
        not ip.is_global
        or ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def address_refused(address: str) -> bool:
    """True for any address a server-side fetch must not reach: loopback, private,
    link-local, shared, multicast, reserved or unspecified, also when it hides inside an
    IPv6 address (IPv4-mapped, 6to4, Teredo)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if _blocked(ip):
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        teredo = ip.teredo or ()
        inner = [ip.ipv4_mapped, ip.sixtofour, *teredo]
        return any(v4 is not None and _blocked(v4) for v4 in inner)
    return False


# The characters of an IPv4 address in any spelling `inet_aton` reads: dotted, octal
# (`0177.0.0.1`), hex (`0x7f.1`), one to four parts (`127.1`, `2130706433`).
_LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")


def literal_address(host: str) -> str | None:
    """The address a host written as an IP literal names, in any spelling a resolver or
    browser would read: bracketed IPv6, legacy IPv4 forms, a trailing dot, percent-escapes
    and full-width digits (normalized as URL parsers do). None for a host name."""
    name = unicodedata.normalize("NFKC", urllib.parse.unquote(host)).lower()
    name = name.strip("[]").removesuffix(".")
    try:
        return str(ipaddress.ip_address(name.split("%")[0]))
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(name):
        try:
            return socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            return None
    return None


def _refuse_literal(host: str, param: str) -> None:
    """A 400, with no connection tried, for a host that spells a refused address."""
    address = literal_address(host)
    if address is not None and address_refused(address):
        raise bad(
            f"Invalid '{param}': refusing to fetch from '{host}': it is {address}, a "
            "loopback, private, link-local or reserved address.",
            param,
            "remote_address_not_allowed",
        )


def _parse(url: str, param: str, failed: str) -> httpx.URL:
    """`url` as an http(s) URL whose host is not a refused address in any spelling."""
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        host = None
    if host:
        _refuse_literal(host, param)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise bad(f"Invalid '{param}': not a valid URL ({exc}).", param, failed) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise bad(f"Invalid '{param}': only http and https URLs can be fetched.", param, failed)
    _refuse_literal(parsed.host, param)
    return parsed


async def _pinned_address(url: httpx.URL, param: str) -> str:
    """The one address to connect to for `url`, after every address its host resolves to
    passed `address_refused` (so DNS cannot swap in a private one between check and use)."""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            url.host, port, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise bad(
            f"Invalid '{param}': the host '{url.host}' could not be resolved ({exc}).",
            param,
            "failed_to_download",
        ) from None
    addresses = [str(info[4][0]) for info in infos]
    refused = [a for a in addresses if address_refused(a)]
    if refused or not addresses:
        raise bad(
            f"Invalid '{param}': refusing to fetch from '{url.host}': it resolves to "
            f"{', '.join(refused) or 'nothing'}, a loopback, private, link-local or reserved "
            "address.",
            param,
            "remote_address_not_allowed",
        )
    return addresses[0]


async def fetch_remote(
    url: str, param: str, *, limit: int, timeout: float, what: str
) -> tuple[bytes, str, str]:
    """GET an http(s) URL, checking the address of every redirect hop, within `timeout`
    seconds and `limit` bytes → (body, content type, final URL)."""
    failed = "failed_to_download_image" if what == "image" else "failed_to_download_file"
    try:
        async with asyncio.timeout(timeout):
            async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
                current = _parse(url, param, failed)
                for _ in range(MAX_REDIRECTS + 1):
                    address = await _pinned_address(current, param)
                    request = client.build_request(
                        "GET",
                        current.copy_with(host=address),
                        headers={"host": current.netloc.decode("ascii")},
                        extensions={"sni_hostname": current.host},
                    )
                    response = await client.send(request, stream=True)
                    try:
                        if response.is_redirect and "location" in response.headers:
                            location = response.headers["location"]
                            current = _parse(str(current.join(location)), param, failed)
                            continue
                        if response.status_code != 200:
                            raise bad(
                                f"Invalid '{param}': fetching the {what} failed with HTTP "
                                f"{response.status_code}.",
                                param,
                                failed,
                            )
                        declared = response.headers.get("content-length", "")
                        if declared.isdigit() and int(declared) > limit:
                            raise too_many_bytes(param, what, limit)
                        body = bytearray()
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > limit:
                                raise too_many_bytes(param, what, limit)
                        content_type = response.headers.get("content-type", "")
                        return bytes(body), content_type.split(";")[0].strip().lower(), str(current)
                    finally:
                        await response.aclose()
                raise bad(f"Invalid '{param}': more than {MAX_REDIRECTS} redirects.", param, failed)
    except TimeoutError:
        raise bad(
            f"Invalid '{param}': fetching the {what} took longer than {timeout:g} seconds.",
            param,
            failed,
        ) from None
    except httpx.HTTPError as exc:
        raise bad(
            f"Invalid '{param}': fetching the {what} failed ({exc}).", param, failed
        ) from None
