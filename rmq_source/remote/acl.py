"""RocketMQ ACL signing of remoting requests (the ``AclClientRPCHook`` rule of the Java client).

Every request carries ``AccessKey`` (and ``SecurityToken`` when one is given) among its header
fields, and ``Signature``: Base64 of HmacSHA1 keyed with the secret key, over the UTF-8 of every
other header field's value in the order of the field names, followed by the body bytes. Brokers
with ACL on (4.9 ``aclEnable``, 5.x ``authenticationEnabled``) recompute it; NameServers ignore it.

The secret key never leaves this module in text: :class:`Credentials` hides it from ``repr``,
and nothing here logs.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

ACCESS_KEY = "AccessKey"
SECURITY_TOKEN = "SecurityToken"
SIGNATURE = "Signature"


@dataclass(frozen=True)
class Credentials:
    """An ACL account: its access key (a user name, shown in errors) and secret key (never shown)."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self):
        if not self.access_key or not self.secret_key:
            raise ValueError("ACL credentials need a non-empty access key and secret key")


def signed_fields(fields: dict[str, str], body: bytes, creds: Credentials) -> dict[str, str]:
    """``fields`` (already the strings sent on the wire) plus the ACL fields and the signature."""
    out = {k: v for k, v in fields.items() if k != SIGNATURE}
    out[ACCESS_KEY] = creds.access_key
    if creds.security_token is not None:
        out[SECURITY_TOKEN] = creds.security_token
    # Java sorts the names in a TreeMap (UTF-16 order); header names are ASCII, where it is the same
    content = "".join(out[k] for k in sorted(out)).encode("utf-8") + (body or b"")
    digest = hmac.new(creds.secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    out[SIGNATURE] = base64.b64encode(digest).decode("ascii")
    return out
