"""Sign-in that cannot be guessed at: after too many failed passwords for one user from one
address, that pair waits before the password is even looked at.

Counters live in Redis so every control-plane process shares them: one key per
(username, address) counts failures for a window that starts at the first one, and a
second key holds when the pair was locked. A success clears both. When Redis is away,
sign-in goes on unthrottled: a broken Redis must not lock every operator out.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

import redis
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from audit.actors import SIGN_IN_THROTTLE
from audit.receivers import client_address
from audit.redis import redis_client
from fleet.actions.sign_ins import record_lockout

log = logging.getLogger("llmgw.fleet.pages.sign_in")

KEY_PREFIX = "llmgw:sign-in"


@dataclass(frozen=True)
class Lockout:
    """A (username, address) pair that must wait, and until when (epoch seconds)."""

    username: str
    address: str
    until: float

    def message(self, now: float) -> str:
        return (
            f"Too many failed sign-ins for {self.username} from {self.address}: "
            f"try again in {_minutes(self.until - now)}."
        )


def _keys(username: str, address: str) -> tuple[str, str]:
    # Case-folded, since a user named Olga must not get a second five tries as OLGA; hashed,
    # so a 150-character name or an odd byte never makes an odd key.
    digest = hashlib.sha256(f"{username.casefold()}\n{address}".encode()).hexdigest()[:32]
    return f"{KEY_PREFIX}:failures:{digest}", f"{KEY_PREFIX}:locked:{digest}"


def _now() -> float:
    # Django's clock, not Redis's: the lock's start is compared here, so a test that moves
    # time moves the lock too, and Redis's own expiry only tidies up behind it.
    return timezone.now().timestamp()


def lockout_for(username: str, address: str) -> Lockout | None:
    """The lockout that holds for this pair now, or None (also when Redis is away)."""
    failures_key, locked_key = _keys(username, address)
    try:
        client = redis_client()
        raw = client.get(locked_key)
        if raw is None:
            return None
        until = float(raw) + settings.SIGN_IN_WINDOW
        if _now() < until:
            return Lockout(username, address, until)
        client.delete(failures_key, locked_key)
    except (redis.RedisError, ValueError) as exc:
        log.warning("sign-in throttling is off: cannot read its counters (%s)", exc)
    return None


def note_failure(username: str, address: str) -> Lockout | None:
    """Count a failed sign-in; return the lockout when this failure reached the limit."""
    failures_key, locked_key = _keys(username, address)
    window = settings.SIGN_IN_WINDOW
    try:
        client = redis_client()
        with client.pipeline(transaction=True) as pipe:
            # SET NX EX then INCR in one transaction: the window starts at the first failure
            # and the key can never be left without its expiry.
            pipe.set(failures_key, 0, ex=window, nx=True)
            pipe.incr(failures_key)
            failures = pipe.execute()[1]
        if failures < settings.SIGN_IN_FAILURE_LIMIT:
            return None
        started = _now()
        # NX: of two processes that both see the limit reached, only one locks and says so.
        if not client.set(locked_key, repr(started), ex=window, nx=True):
            return None
    except redis.RedisError as exc:
        log.warning("sign-in throttling is off: cannot count a failure (%s)", exc)
        return None
    lockout = Lockout(username, address, started + window)
    record_lockout(username, address, failures, _minutes(window), actor=SIGN_IN_THROTTLE)
    return lockout


def clear_failures(username: str, address: str) -> None:
    """Forget this pair's failures: the person at that address knows the password."""
    try:
        redis_client().delete(*_keys(username, address))
    except redis.RedisError as exc:
        log.warning("sign-in throttling: cannot clear the count for %s (%s)", username, exc)


def _minutes(seconds: float) -> str:
    # Rounded up, so the wait we name is never shorter than the wait there is.
    minutes = max(1, math.ceil(seconds / 60))
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


class ThrottledSignIn:
    """Refuses a locked (username, address) pair before authenticating, counts failures
    and clears them on success; mixed in before an AuthenticationForm."""

    @sensitive_variables()
    def clean(self):
        username = self.cleaned_data.get("username")
        if not username or not self.cleaned_data.get("password"):
            return super().clean()
        address = client_address(self.request)
        lockout = lockout_for(username, address)
        if lockout is not None:
            raise ValidationError(lockout.message(_now()), code="throttled")
        try:
            return super().clean()
        except ValidationError:
            # A right password refused (inactive, not staff) is no guess: only count
            # the sign-ins that did not authenticate.
            if self.user_cache is None:
                lockout = note_failure(username, address)
                if lockout is not None:
                    raise ValidationError(lockout.message(_now()), code="throttled") from None
            raise
        finally:
            if self.user_cache is not None:
                clear_failures(username, address)


class SignInForm(ThrottledSignIn, AuthenticationForm):
    """The pages' sign-in."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That user name and password do not match. Try again.",
    }


class AdminSignInForm(ThrottledSignIn, AdminAuthenticationForm):
    """The admin's sign-in, throttled with the same counters as the pages'."""
