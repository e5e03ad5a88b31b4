"""The catalog in Django's admin, held to what an apply or the API is held to.

Changes follow the ``operators`` group (a staff user with Django's model permissions but
outside it may look, not change); every form is checked by the catalog file's own rules
and by who may add code for nodes (``catalog.engine_admin``), each problem shown on the
form with nothing saved; and saves go through the catalog's verbs (an Event naming the
user, routers told at once).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from catalog.actions.api_keys import update_key
from catalog.actions.entries import delete_row, save_entry
from catalog.engine_admin import EngineAdminRequired, check_row
from catalog.keys import LIMIT_FIELDS, ApiKeyRefused
from catalog.models import ApiKey, Engine, Fabric, Membership, Model, Pool, Profile, Team
from catalog.permissions import is_operator
from catalog.plan import profile_values
from catalog.schema import EngineEntry, ModelEntry, NamedEntry, ProfileEntry, validate_fields


class CatalogEntryForm(forms.ModelForm):
    """A row checked as a catalog file's entry would be, then by who may add code for nodes."""

    entry_class: ClassVar[type[Any]] = NamedEntry
    user: ClassVar[Any] = None  # who is saving: set per request by the admin

    def entry_values(self) -> dict[str, Any]:
        """The entry as the form now says it (the row's value where the form has no field)."""
        return {
            name: self.cleaned_data[name] if name in self.fields else getattr(self.instance, name)
            for name in self.entry_class.model_fields
            if name in self.fields or hasattr(self.instance, name)
        }

    def columns(self, entry: Any) -> dict[str, Any]:
        """The row's columns as the checked entry sets them (in the file's one spelling)."""
        return entry.model_dump()

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        if self.errors:
            return cleaned  # a field Django could not even read says so first
        entry, problems = validate_fields(self.entry_class, self.entry_values())
        for field, said in problems.items():
            self.add_error(field if field in self.fields else None, said)
        if entry is not None:
            cleaned.update({k: v for k, v in self.columns(entry).items() if k in self.fields})
        return cleaned

    def _post_clean(self) -> None:
        super()._post_clean()  # type: ignore[misc]  # the row now holds what would be saved
        if not self.errors:
            try:
                check_row(self.instance, self.user)
            except EngineAdminRequired as exc:
                self.add_error(None, exc.problems)


class EngineForm(CatalogEntryForm):
    entry_class = EngineEntry


class ModelForm(CatalogEntryForm):
    entry_class = ModelEntry

    def columns(self, entry: Any) -> dict[str, Any]:
        return entry.model_dump(exclude={"profiles"})


class ProfileForm(CatalogEntryForm):
    entry_class = ProfileEntry

    def entry_values(self) -> dict[str, Any]:
        values = super().entry_values()
        surge, unavailable = (
            self.cleaned_data.get(name, getattr(self.instance, name))
            for name in ("rollout_surge", "rollout_unavailable")
        )
        return {**values, "rollout": {"surge": surge, "unavailable": unavailable}}

    def columns(self, entry: Any) -> dict[str, Any]:
        columns = profile_values(entry)
        if entry.autoscale is not None:
            columns.pop("replicas")  # the reconciler's to set, as an apply leaves it
        return columns


class OperatorsChange:
    """Adding, changing and deleting follow the operators group, as on the pages and the
    API, whatever Django model permissions a staff user holds."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return is_operator(request.user)

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return is_operator(request.user)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return is_operator(request.user)


class CatalogEntryAdmin(OperatorsChange, admin.ModelAdmin):
    """Saves and deletes through the catalog's verbs: an Event naming the admin, and
    routers told at once, as through the API."""

    form = CatalogEntryForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.user = request.user  # a class made for this request alone
        return form

    def save_model(self, request, obj, form, change) -> None:
        save_entry(obj, changed=form.changed_data, actor=request.user)

    def delete_model(self, request, obj) -> None:
        delete_row(obj, actor=request.user)

    def delete_queryset(self, request, queryset) -> None:
        for row in queryset:
            delete_row(row, actor=request.user)

    def save_formset(self, request, form, formset, change) -> None:
        for row in formset.save(commit=False):
            changed = next((f.changed_data for f in formset.forms if f.instance is row), ())
            save_entry(row, changed=changed, actor=request.user)
        for row in formset.deleted_objects:
            delete_row(row, actor=request.user)


class ProfileInline(OperatorsChange, admin.StackedInline):
    model = Profile
    form = ProfileForm
    extra = 0

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form.user = request.user  # a class made for this request alone
        return formset


@admin.register(Model)
class ModelAdmin(CatalogEntryAdmin):
    form = ModelForm
    list_display = ["name", "source"]
    search_fields = ["name", "source"]
    inlines = [ProfileInline]


@admin.register(Profile)
class ProfileAdmin(CatalogEntryAdmin):
    form = ProfileForm
    list_display = ["__str__", "engine", "replicas", "gpus_per_rank", "pool"]
    list_filter = ["engine", "pool"]


@admin.register(Engine)
class EngineAdmin(CatalogEntryAdmin):
    form = EngineForm
    list_display = ["name", "version"]


admin.site.register(Pool, CatalogEntryAdmin)
admin.site.register(Fabric, CatalogEntryAdmin)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Limits, expiry and priority are changed through the key verb, so routers hear of it
    at once; keys are created where they can be shown once (`llmgw_ctl keys create`, the
    API), and revoked rather than deleted, so their usage keeps a name."""

    list_display = ["name", "prefix", "team", *LIMIT_FIELDS, "priority", "expires_at",
                    "revoked_at"]  # fmt: skip
    list_filter = ["team"]
    readonly_fields = ["name", "prefix", "team", "member", "hashed_key", "created_at",
                       "revoked_at"]  # fmt: skip
    fields = ["name", "prefix", "team", "member", "allowed_models", *LIMIT_FIELDS, "priority",
              "expires_at", "created_at", "revoked_at"]  # fmt: skip

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return is_operator(request.user)  # as on the API: keys are for operators

    def save_model(self, request, obj, form, change) -> None:
        data = form.cleaned_data
        try:
            update_key(
                obj.prefix,
                allowed_models=data["allowed_models"],
                limits={name: data[name] for name in LIMIT_FIELDS},
                expires_at=data["expires_at"],
                priority=data["priority"],
                actor=request.user,
            )
        except ApiKeyRefused as exc:
            self.message_user(request, str(exc), level=messages.ERROR)


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ["user", "role"]
    readonly_fields = ["user", "role"]
    extra = 0

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Shown, not changed here: teams change through their verbs (`llmgw_ctl teams`, the
    REST API), which check roles, record Events and tell routers (catalog/teams/)."""

    list_display = ["name", *LIMIT_FIELDS, "key_cap"]
    readonly_fields = ["name", "description", *LIMIT_FIELDS, "key_cap", "created_at"]
    inlines = [MembershipInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
