"""TLS for every listener (AMQP's ``--tls-port``, and the HTTP and MQTT listeners): one
``ssl.SSLContext`` built from the config, TLS 1.2 and 1.3 only, and the client
certificate's CN for the EXTERNAL mechanism.

Options (``Config``): ``tls_cert`` / ``tls_key`` (PEM, required), ``tls_ca`` (PEM bundle
that signs client certificates), ``tls_verify`` ("peer": verify a client certificate
when one is sent, "none": never ask for one -- RabbitMQ's ``verify_peer`` /
``verify_none``) and ``tls_fail_if_no_peer_cert`` (with "peer": refuse clients without
a certificate). The context is built once at start; a bad file is one clear line
(``TLSConfigError``)."""
from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config

VERIFY_MODES = ("peer", "none")


class TLSConfigError(ValueError):
    """The TLS options or files are unusable: one line for the command line."""


def server_context(config: Config) -> ssl.SSLContext:
    """The server-side context of ``config``; raises TLSConfigError."""
    cert = config.tls_cert
    key = config.tls_key
    ca = config.tls_ca
    verify = config.tls_verify or ("peer" if ca else "none")
    fail_if_no_cert = config.tls_fail_if_no_peer_cert
    if not cert or not key:
        raise TLSConfigError("TLS needs --tls-cert and --tls-key")
    if verify not in VERIFY_MODES:
        raise TLSConfigError(f"--tls-verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
    if verify == "peer" and not ca:
        raise TLSConfigError("--tls-verify peer needs --tls-ca (the CA that signs client certificates)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load --tls-cert {cert} / --tls-key {key}: "
                             f"{exc.strerror or exc}") from None
    if ca:
        try:
            ctx.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load --tls-ca {ca}: "
                                 f"{exc.strerror or exc}") from None
    if verify == "peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if fail_if_no_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_cert_user(ssl_object) -> str | None:
    """The CN of the client's verified certificate (the EXTERNAL mechanism's user name),
    None without one. ``ssl_object``: an ``ssl.SSLObject`` / ``SSLSocket`` or a
    ``trio.SSLStream`` after its handshake."""
    try:
        cert = ssl_object.getpeercert()
    except (ValueError, AttributeError):
        return None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                return value
    return None
