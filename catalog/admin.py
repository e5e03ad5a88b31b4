from django.contrib import admin, messages

from catalog.actions.api_keys import update_key
from catalog.actions.entries import delete_row, save_entry
from catalog.keys import LIMIT_FIELDS, ApiKeyRefused
from catalog.models import ApiKey, Engine, Fabric, Model, Pool, Profile


class CatalogEntryAdmin(admin.ModelAdmin):
    """Saves and deletes through the catalog's verbs: an Event naming the admin, and
    routers told at once, as through the API."""

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


class ProfileInline(admin.StackedInline):
    model = Profile
    extra = 0


@admin.register(Model)
class ModelAdmin(CatalogEntryAdmin):
    list_display = ["name", "source"]
    search_fields = ["name", "source"]
    inlines = [ProfileInline]


@admin.register(Profile)
class ProfileAdmin(CatalogEntryAdmin):
    list_display = ["__str__", "engine", "replicas", "gpus_per_rank", "pool"]
    list_filter = ["engine", "pool"]


@admin.register(Engine)
class EngineAdmin(CatalogEntryAdmin):
    list_display = ["name", "version"]


admin.site.register(Pool, CatalogEntryAdmin)
admin.site.register(Fabric, CatalogEntryAdmin)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Limits, expiry and priority are changed through the key verb, so routers hear of it
    at once; keys are created where they can be shown once (`llmgw_ctl keys create`, the
    API), and revoked rather than deleted, so their usage keeps a name."""

    list_display = ["name", "prefix", *LIMIT_FIELDS, "priority", "expires_at", "revoked_at"]
    readonly_fields = ["name", "prefix", "hashed_key", "created_at", "revoked_at"]
    fields = ["name", "prefix", "allowed_models", *LIMIT_FIELDS, "priority", "expires_at",
              "created_at", "revoked_at"]  # fmt: skip

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

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
