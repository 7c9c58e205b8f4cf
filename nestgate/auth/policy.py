"""Who may enter a protected site or route: its policy, compiled per user at load.

`policy = "one_factor" | "two_factor" | "bypass" | "deny"`, `allow_users` and
`allow_groups` on a [[site]] or [[site.route]] (a route that sets any of them replaces
the site's three). The network rules (`allow`/`deny` CIDRs, `exempt_local`, the dynamic
allow-list) are decided before, by nestgate.access.

`decide` is the one decision: (policy, user) -> the verdict. `verdicts` runs it for
every configured user when the config is loaded, so a request costs one dict lookup on
the session's user name, never a parse or a walk through groups. Sign-in asks every
user who has a second factor for it, so a session always carries every factor its
user has: `one_factor` (the default) admits any allowed user, `two_factor` only those
who have a second factor.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("one_factor", "two_factor", "bypass", "deny")
POLICY_KEYS = ("policy", "allow_users", "allow_groups")

ALLOWED = ""
NOT_ALLOWED = "not_allowed"              # not among allow_users / allow_groups
NO_SECOND_FACTOR = "no_second_factor"    # two_factor, and the user has no second factor


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


def decide(policy: UserPolicy, user) -> str:
    """ALLOWED, NOT_ALLOWED or NO_SECOND_FACTOR for a configured `user`
    (nestgate.auth.config.User) under a signing-in `policy`."""
    if policy.policy == "deny":
        return NOT_ALLOWED
    if (policy.allow_users or policy.allow_groups) and user.name not in policy.allow_users \
            and not any(group in policy.allow_groups for group in user.groups):
        return NOT_ALLOWED
    if policy.policy == "two_factor" and not user.second_factor:
        return NO_SECOND_FACTOR
    return ALLOWED


def verdicts(policy: UserPolicy, users) -> dict[str, str]:
    """Every configured user's verdict, by name."""
    return {user.name: decide(policy, user) for user in users}


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
