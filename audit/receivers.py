"""What Django tells of accounts, recorded as Events through ``audit.actions``: sign-ins
and failed ones (whichever form or identity provider took them), and changes of an
account's groups or superuser flag (whichever page, admin or shell made them).

Connected once, by ``AuditConfig.ready``. A receiver never raises into the sign-in or the
save it hears: the Event is written in the same transaction, like every verb's.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model, user_logged_in, user_login_failed
from django.contrib.auth.models import AnonymousUser, Group
from django.db.models.signals import m2m_changed, post_save, pre_save
from django.utils.module_loading import import_string

from audit.actions import (
    record_failed_sign_in,
    record_roles_changed,
    record_sign_in,
    record_superuser_changed,
)
from audit.actors import acting_now
from core.addresses import request_origin


def connect() -> None:
    user_model = get_user_model()
    user_logged_in.connect(_signed_in, dispatch_uid="llmgw-audit-sign-in")
    user_login_failed.connect(_sign_in_failed, dispatch_uid="llmgw-audit-sign-in-failed")
    m2m_changed.connect(
        _groups_changed, sender=user_model.groups.through, dispatch_uid="llmgw-audit-groups"
    )
    pre_save.connect(_before_save, sender=user_model, dispatch_uid="llmgw-audit-before-save")
    post_save.connect(_after_save, sender=user_model, dispatch_uid="llmgw-audit-after-save")


def client_address(request) -> str:
    """The address a request came from, for the sign-in throttle and every sign-in Event:
    REMOTE_ADDR, or behind a trusted proxy (settings.TRUSTED_PROXIES) the client address
    it forwarded. X-Forwarded-For from anyone else is whatever the client chose to send."""
    if request is None:
        return "unknown"
    meta = request.META
    return request_origin(
        meta.get("REMOTE_ADDR", ""), meta.get("HTTP_X_FORWARDED_FOR", ""), settings.TRUSTED_PROXIES
    )


def records_its_own(backend: str) -> bool:
    """Whether the backend a user signed in with records its sign-ins itself (an identity
    provider's, which names the provider): said by ``records_sign_ins`` on its class."""
    try:
        return bool(getattr(import_string(backend), "records_sign_ins", False))
    except ImportError:
        return False


def _signed_in(sender, request, user, **kwargs) -> None:
    backend = getattr(user, "backend", "")
    if backend and records_its_own(backend):
        return
    record_sign_in(user, client_address(request), backend, actor=user)


def _sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    if "password" not in credentials:
        return  # not a password refused: a provider's callback, which records its own
    # Django has already masked the password in ``credentials``; the username is kept.
    username = str(credentials.get("username") or credentials.get("email") or "")
    # Whoever typed it is no one llmgw knows: the Event names no account.
    record_failed_sign_in(username, client_address(request), actor=AnonymousUser())


def _groups_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    if action == "pre_clear":
        # clear() says no names afterwards: read the groups it is about to remove now.
        if reverse:
            for user in instance.user_set.all():
                record_roles_changed(user.get_username(), removed=[instance.name],
                                     actor=acting_now())  # fmt: skip
        else:
            names = list(instance.groups.values_list("name", flat=True))
            record_roles_changed(instance.get_username(), removed=names, actor=acting_now())
        return
    if action not in ("post_add", "post_remove") or not pk_set:
        return
    side = "added" if action == "post_add" else "removed"
    if reverse:  # group.user_set.add(user, …): each user joined or left this group
        for user in get_user_model()._default_manager.filter(pk__in=pk_set):
            record_roles_changed(user.get_username(), **{side: [instance.name]},
                                 actor=acting_now())  # fmt: skip
    else:
        names = list(Group.objects.filter(pk__in=pk_set).values_list("name", flat=True))
        record_roles_changed(instance.get_username(), **{side: names}, actor=acting_now())


def _before_save(sender, instance, update_fields=None, **kwargs) -> None:
    # Only a save that may write the flag costs a read (a sign-in saves last_login alone).
    if instance.pk is None or (update_fields is not None and "is_superuser" not in update_fields):
        return
    was = sender._default_manager.filter(pk=instance.pk).values_list("is_superuser", flat=True)
    instance._llmgw_was_superuser = was.first()


def _after_save(sender, instance, created, **kwargs) -> None:
    was = False if created else getattr(instance, "_llmgw_was_superuser", None)
    instance.__dict__.pop("_llmgw_was_superuser", None)
    if was is None or bool(was) == bool(instance.is_superuser):
        return
    record_superuser_changed(instance.get_username(), instance.is_superuser, actor=acting_now())
