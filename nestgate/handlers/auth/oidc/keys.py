"""Signing keys of the OpenID provider: made and rotated by nestgate, kept in the shared
store (nestgate.handlers.auth.oidc.state), so each worker and instance signs with the same key.

Time is cut into periods of `[auth] signing_key_rotation`. The key of the current
period signs; the JWKS publishes the keys of the previous, current and next periods:
an ID token signed just before a rotation still verifies after it, and a relying
party that caches the JWKS already holds the next key before it signs anything.
A period's key is made by whichever worker needs it first (the store keeps the first
one written, nestgate.handlers.auth.oidc.state); RSA, RS256, the algorithm every relying party
supports (OpenID Connect Core 15.1).
"""

from __future__ import annotations

import json
import secrets
import time

from joserfc.jwk import RSAKey

ALG = "RS256"
RSA_BITS = 2048


def period_of(now: float, rotation: float) -> int:
    return int(now // rotation)


def new_key_json(period: int) -> str:
    kid = f"{period}-{secrets.token_hex(4)}"
    key = RSAKey.generate_key(RSA_BITS, parameters={"kid": kid, "use": "sig", "alg": ALG},
                              private=True)
    return json.dumps(key.as_dict(private=True))


class SigningKeys:
    """The worker's copy of the keys around now; asks the store again when the period
    turns. Used from the provider's threads only (its calls are synchronous)."""

    def __init__(self, rotation: float) -> None:
        self.rotation = rotation
        self._period: int | None = None
        self._keys: dict[int, RSAKey] = {}
        self._published = b""                 # the JWKS of `_period`, as served

    def _load(self, state) -> int:
        period = period_of(time.time(), self.rotation)
        if period != self._period:
            wanted = (period - 1, period, period + 1)
            found = state.keys(wanted)
            for p in (period, period + 1):     # the previous one is never made late
                if p not in found:
                    found[p] = state.signing_key(p, new_key_json(p))
            self._keys = {p: RSAKey.import_key(json.loads(v)) for p, v in found.items()}
            state.drop_keys_before(period - 1)
            self._published = json.dumps(self._jwks()).encode()
            self._period = period
        return period

    def current(self, state) -> RSAKey:
        period = self._load(state)        # (before self._keys is read: it replaces it)
        return self._keys[period]

    def jwks(self, state) -> dict:
        self._load(state)
        return self._jwks()

    def _jwks(self) -> dict:
        return {"keys": [self._keys[p].as_dict(private=False) for p in sorted(self._keys)]}

    def published(self) -> bytes | None:
        """The JWKS as served, when this period's keys are loaded (no store needed)."""
        if self._period != period_of(time.time(), self.rotation):
            return None
        return self._published