"""Who may enter a protected site or route: its policy, compiled per user at load.

`policy = "one_factor" | "two_factor" | "bypass" | "deny"`, `allow_users` and
`allow_groups` on a [[site]] or [[site.route]] (a route that sets any of them replaces
the site's three). The network rules (`allow`/`deny` CIDRs, `exempt_local`, the dynamic
allow-list) are decided before, by nestgate.pipeline.access.

`decide` is the one decision: (policy, user, factors) -> the verdict. `verdicts` runs
it for every configured user, signed in with one factor and with two, when the config
is loaded, so a request costs one dict lookup on the session's key (`session_key`: the
user name for a session of two factors, the name and ONE_FACTOR for one), never a
parse or a walk through groups.

A session records what its user signed in with (words of FACTORS): a password with a
TOTP code, a passkey or a recovery code is two factors, and so is a passkey alone
when the authenticator verified the user (PIN or biometric: "passkey uv"); a password
alone, or a passkey that did not verify the user, is one. Sign-in asks every user who
has a TOTP secret for a second factor, so only users without one have one-factor
sessions. `one_factor` (the default) admits any allowed user, `two_factor` only a
session of two factors.

A sign-in through an OpenID provider ([[auth.oidc]]) records "oidc:<provider>": one
factor, whatever the provider asked for, so `two_factor` refuses it. A configured user
signed in that way has the key of one factor; one the config does not name is keyed
by the `User` the provider's claims make (nestgate.handlers.auth.oidc.client.session_key_of),
and `session_user` gives that user's name too.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("one_factor", "two_factor", "bypass", "deny")
POLICY_KEYS = ("policy", "allow_users", "allow_groups")

ALLOWED = ""
NOT_ALLOWED = "not_allowed"              # not among allow_users / allow_groups
NO_SECOND_FACTOR = "no_second_factor"    # two_factor, and the session has one factor

# What a session was signed in with (space-separated in the store's `factors`).
PASSWORD, TOTP, PASSKEY, VERIFIED, RECOVERY = "password", "totp", "passkey", "uv", "recovery"
OIDC = "oidc"        # "oidc:<provider name>": signed in through that OpenID provider
# Appended to the user name for a session of one factor: no user name holds a space.
ONE_FACTOR = " 1"


def two_factors(factors: str) -> bool:
    """A session signed in with `factors` counts as two factors."""
    return len(factors.split()) >= 2


def session_key(user: str, factors: str) -> str:
    """What the gate's answers are looked up by, for a session of `user`."""
    return user if two_factors(factors) else user + ONE_FACTOR


def session_user(key) -> str:
    """The user name in a `session_key`, or of the `User` keying a session from an
    OpenID provider for a user the config does not name."""
    if not isinstance(key, str):
        return key.name
    return key[:-len(ONE_FACTOR)] if key.endswith(ONE_FACTOR) else key


@dataclass(frozen=True)
class UserPolicy:
    policy: str = "one_factor"
    allow_users: tuple[str, ...] = ()     # empty, with allow_groups empty: any user
    allow_groups: tuple[str, ...] = ()

    @property
    def signs_in(self) -> bool:
        """Requests need a signed-in user (bypass and deny need none)."""
        return self.policy in ("one_factor", "two_factor")


DEFAULT_POLICY = UserPolicy()


def read_policy(s) -> UserPolicy | None:
    """The policy keys of a [[site]] or [[site.route]] table (config `_Section`); None
    when the table sets none of them."""
    if not any(k in s.data for k in POLICY_KEYS):
        s.seen.update(POLICY_KEYS)
        return None
    policy = UserPolicy(s.choice("policy", DEFAULT_POLICY.policy, POLICIES),
                        s.strings("allow_users"), s.strings("allow_groups"))
    if not policy.signs_in and (policy.allow_users or policy.allow_groups):
        s.fail("allow_users" if policy.allow_users else "allow_groups",
               f"no user or group lists with policy = \"{policy.policy}\" (it admits "
               "without signing in, or nobody)")
    return policy


def decide(policy: UserPolicy, user, two: bool = True) -> str:
    """ALLOWED, NOT_ALLOWED or NO_SECOND_FACTOR for a configured `user`
    (nestgate.handlers.auth.config.User) signed in with two factors (`two`) or one, under a
    signing-in `policy`."""
    if policy.policy == "deny":
        return NOT_ALLOWED
    if (policy.allow_users or policy.allow_groups) and user.name not in policy.allow_users \
            and not any(group in policy.allow_groups for group in user.groups):
        return NOT_ALLOWED
    if policy.policy == "two_factor" and not two:
        return NO_SECOND_FACTOR
    return ALLOWED


def verdicts(policy: UserPolicy, users) -> dict[str, str]:
    """Every configured user's verdict, by `session_key`: signed in with two factors
    and with one."""
    out = {}
    for user in users:
        out[user.name] = decide(policy, user, True)
        out[user.name + ONE_FACTOR] = decide(policy, user, False)
    return out


def policy_warnings(where: str, policy: UserPolicy, users) -> list[str]:
    """Names in the lists that no configured user matches: a typo, or a user gone from
    the users file (not an error, so that removing a user is a reload, not an edit)."""
    names = {u.name for u in users}
    groups = {g for u in users for g in u.groups}
    out = [f"{where}.allow_users: no configured user is called {name!r}"
           for name in policy.allow_users if name not in names]
    out += [f"{where}.allow_groups: no configured user is in the group {group!r}"
            for group in policy.allow_groups if group not in groups]
    return out
