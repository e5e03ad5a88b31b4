from django.contrib import admin

from catalog.models import ApiKey, Engine, Fabric, Model, Pool, Profile


class ProfileInline(admin.StackedInline):
    model = Profile
    extra = 0


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "source"]
    search_fields = ["name", "source"]
    inlines = [ProfileInline]


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ["__str__", "engine", "replicas", "gpus_per_rank", "pool"]
    list_filter = ["engine", "pool"]


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    list_display = ["name", "version"]


admin.site.register(Pool)
admin.site.register(Fabric)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "created_at", "revoked_at"]
    readonly_fields = ["prefix", "hashed_key", "created_at"]
