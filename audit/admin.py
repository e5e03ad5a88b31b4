from django.contrib import admin

from audit.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["at", "kind", "subject", "from_state", "to_state", "reason", "actor_name"]
    list_filter = ["kind"]
    search_fields = ["subject", "reason", "actor_name"]
    readonly_fields = ["actor"]
