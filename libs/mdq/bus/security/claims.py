"""Reading what a NATS credential allows: the claims of its JWT, not verified.

Verifying and minting credentials is ``mdq.bus.security.auth``'s; this is the one read both it and
the runners' credential desk (``mdq.bus.security.runner_creds``) need.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: for reading what a credential allows)."""
    body = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return claims
